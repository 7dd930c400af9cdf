#!/usr/bin/env python3
"""Reference timings for the media benchmarks (scripts/gpu/media_bench.sh), on the folders that
tools/mkshape_media.py writes, and the inputs both sides use.

    python3 bench/media_ref.py inputs OUTDIR                  # clip.wav (10 s, 16 kHz), img448.png, img1024.png
    python3 bench/media_ref.py vision DIR --images A.png,B.png [--device cuda] [--runs 3]
    python3 bench/media_ref.py asr DIR --wav clip.wav --seconds 10 [--max-new 32] [--batches 1,32,128]
    python3 bench/media_ref.py tts DIR --text T [--frames 100] [--batches 1,16]

Each timing subcommand prints one JSON line (last line of stdout) and notes on stderr.
- vision: the system transformers' Qwen3_5ForConditionalGeneration (sdpa, bf16): tower time
  per image (get_image_features on the processor's pixel values) and image+text TTFT
  (processor + one forward over the prompt, logits of the last row). Prints the version; a
  transformers without qwen3_5 gives {"skip": ...}.
- asr: qwen-asr 0.0.6's Qwen3ASRForConditionalGeneration + Qwen3ASRProcessor (the transformers
  its wheels pin, from PYTHONPATH: scripts/gpu/media_wheels.sh), bf16, sdpa: processor +
  generate(max_new_tokens = min_new_tokens = --max-new, greedy) over a batch of B copies of
  the clip, as the package's transformers backend batches; audio-seconds per wall second.
- tts: qwen-tts 0.1.1's Qwen3TTSForConditionalGeneration (CustomVoice, non-streaming text,
  the package's sampling defaults, max_new_tokens = --frames) + the 12 Hz decoder's
  chunked_decode (the package's tokenizer.decode path); qwen-tts has no streaming output, so
  its first audio is the whole utterance.
Only the packages' modeling modules are imported (their __init__ pull gradio, sox, librosa,
onnxruntime); librosa is stubbed for qwen-tts (its speaker encoder, unused by CustomVoice).
"""
import argparse
import importlib.util
import json
import os
import struct
import sys
import time
import types
import zlib

import numpy as np


def note(*a):
    print(*a, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- inputs

def write_wav(path, x, rate):
    pcm = np.clip(x * 32767, -32768, 32767).astype("<i2").tobytes()
    with open(path, "wb") as f:
        f.write(b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " +
                struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + b"data" + struct.pack("<I", len(pcm)) + pcm)


def write_png(path, img):
    h, w, _ = img.shape
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def cmd_inputs(a):
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(24)
    # 10 s of speech-like audio: voiced bursts (harmonics of a gliding pitch) and pauses, noise floor
    rate, secs = 16000, a.seconds
    t = np.arange(int(rate * secs)) / rate
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t)
    ph = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * ph) / k for k in range(1, 8))
    env = (np.sin(2 * np.pi * 2.3 * t) > -0.3).astype(np.float64) * (0.6 + 0.4 * np.sin(2 * np.pi * 0.31 * t))
    x = 0.25 * x * env + 0.01 * rng.standard_normal(t.size)
    write_wav(os.path.join(a.out, "clip.wav"), x / np.abs(x).max() * 0.8, rate)
    for n in (448, 1024):
        yy, xx = np.mgrid[0:n, 0:n]
        img = np.stack([(xx * 255 // n), (yy * 255 // n), ((xx ^ yy) & 255)], -1).astype(np.uint8)
        img = np.clip(img.astype(int) + rng.integers(-20, 21, img.shape), 0, 255).astype(np.uint8)
        write_png(os.path.join(a.out, f"img{n}.png"), img)
    note(f"inputs: {a.out}/clip.wav ({secs:g} s), img448.png, img1024.png")


# ----------------------------------------------------------------------------- helpers

def sync(dev):
    import torch
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, dev, runs, warmup=1):
    """Median wall seconds of fn() over runs (after warmup calls), and its last result."""
    out = None
    for _ in range(warmup):
        out = fn()
    ts = []
    for _ in range(runs):
        sync(dev)
        t0 = time.perf_counter()
        out = fn()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), out


def versions():
    import torch
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "transformers_path": os.path.dirname(transformers.__file__)}


def dtype_of(name):
    import torch
    return {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}[name]


def stub_package(pkg, subs=("",)):
    """Registers `pkg` (and pkg.core...) as bare namespace modules so that importing a modeling
    submodule does not run the package's __init__ (which imports its demo / serving deps)."""
    spec = importlib.util.find_spec(pkg)
    if spec is None:
        raise ImportError(f"{pkg} not found (scripts/gpu/media_wheels.sh)")
    root = spec.submodule_search_locations[0]
    for sub in subs:
        name = pkg + sub.replace("/", ".")
        m = types.ModuleType(name)
        m.__path__ = [root + sub]
        sys.modules[name] = m


# ----------------------------------------------------------------------------- vision

def cmd_vision(a):
    import torch
    v = versions()
    note(f"vision reference: torch {v['torch']}, transformers {v['transformers']}")
    try:
        from transformers import Qwen3_5ForConditionalGeneration
    except ImportError as e:
        print(json.dumps({"skip": f"transformers {v['transformers']} has no Qwen3_5ForConditionalGeneration ({e})",
                          **v}))
        return 0
    try:
        import fla  # noqa: F401
        v["fla"] = True
    except ImportError:
        v["fla"] = False  # transformers' torch fallback for the GDN layers (slower prefill)
    torch.set_grad_enabled(False)
    dev, dt = a.device, dtype_of(a.dtype)
    t0 = time.perf_counter()
    model = Qwen3_5ForConditionalGeneration.from_pretrained(a.dir, dtype=dt, attn_implementation="sdpa").to(dev).eval()
    load_s = time.perf_counter() - t0
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    pre = json.load(open(os.path.join(a.dir, "preprocessor_config.json")))
    proc, proc_note = None, "transformers image processor"
    try:
        from transformers import AutoImageProcessor
        proc = AutoImageProcessor.from_pretrained(a.dir)
    except Exception as e:  # no PIL / torchvision on the machine: synthetic pixel values instead
        proc_note = f"no image processor ({type(e).__name__}: {e}); synthetic pixel values, TTFT without preprocessing"
    note(f"vision: loaded in {load_s:.1f} s; {proc_note}")
    import inspect
    fwd_args = inspect.signature(model.forward).parameters
    out = {"what": "vision", "load_s": load_s, "dtype": a.dtype, "device": dev, "processor": proc_note, **v,
           "images": []}
    for path in a.images.split(","):
        img = read_png(path)
        h, w = img.shape[:2]
        P, M = pre["patch_size"], pre["merge_size"]

        def prep():
            if proc is not None:
                r = proc(images=[img], return_tensors="pt")
                return r["pixel_values"].to(dev, dt), r["image_grid_thw"].to(dev)
            gh, gw = round(h / (P * M)) * M, round(w / (P * M)) * M
            pv = torch.zeros(gh * gw, 3 * 2 * P * P, device=dev, dtype=dt)
            return pv, torch.tensor([[1, gh, gw]], device=dev)

        pv, thw = prep()
        n_img = int(thw.prod()) // (M * M)
        ids = ([1] + list(range(100, 103)) + [cfg["vision_start_token_id"]] + [cfg["image_token_id"]] * n_img +
               [cfg["vision_end_token_id"]] + list(range(110, 122)) + [2, 1] + list(range(130, 133)))
        ids_t = torch.tensor([ids], device=dev)
        mm_types = (ids_t == cfg["image_token_id"]).long()  # 1: image rows (what the processor returns)

        def tower():
            f = model.model.get_image_features(pv, thw)
            return f

        def ttft():
            p, g = prep()
            kw = {"mm_token_type_ids": mm_types} if "mm_token_type_ids" in fwd_args else {}
            o = model(input_ids=ids_t, attention_mask=torch.ones_like(ids_t), pixel_values=p, image_grid_thw=g,
                      logits_to_keep=1, **kw)
            return o.logits[0, -1].float().argmax().item()

        tw, _ = timed(tower, dev, a.runs)
        tt, _ = timed(ttft, dev, a.runs)
        row = {"image": os.path.basename(path), "size": [w, h], "visual_tokens": n_img, "prompt_tokens": len(ids),
               "tower_ms": tw * 1e3, "ttft_ms": tt * 1e3}
        note(f"vision {w}x{h}: {n_img} visual tokens, tower {tw * 1e3:.1f} ms, TTFT {tt * 1e3:.1f} ms")
        out["images"].append(row)
        print(json.dumps(out), flush=True)
    return 0


def read_png(path):
    """The 8-bit RGB PNGs cmd_inputs writes (filter 0 rows) -> [h, w, 3] uint8."""
    d = open(path, "rb").read()
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(d):
        n, t = struct.unpack(">I4s", d[pos:pos + 8])
        body = d[pos + 8:pos + 8 + n]
        if t == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif t == b"IDAT":
            idat += body
        pos += 12 + n
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 0).all(), "read_png: only filter-0 rows (bench/media_ref.py inputs writes those)"
    return raw[:, 1:].reshape(h, w, 3).copy()


# ----------------------------------------------------------------------------- ASR

def read_wav(path):
    d = open(path, "rb").read()
    rate = struct.unpack("<I", d[24:28])[0]
    k = d.index(b"data")
    n = struct.unpack("<I", d[k + 4:k + 8])[0]
    return np.frombuffer(d[k + 8:k + 8 + n], "<i2").astype(np.float32) / 32768.0, rate


def cmd_asr(a):
    import torch
    stub_package("qwen_asr", ("", "/core"))
    v = versions()
    note(f"asr reference: torch {v['torch']}, transformers {v['transformers']} ({v['transformers_path']})")
    from qwen_asr.core.transformers_backend.modeling_qwen3_asr import Qwen3ASRForConditionalGeneration
    from qwen_asr.core.transformers_backend.processing_qwen3_asr import Qwen3ASRProcessor
    from transformers import Qwen2TokenizerFast, WhisperFeatureExtractor
    torch.set_grad_enabled(False)
    dev, dt = a.device, dtype_of(a.dtype)
    t0 = time.perf_counter()
    model = Qwen3ASRForConditionalGeneration.from_pretrained(a.dir, dtype=dt, attn_implementation="sdpa")
    th = model.thinker
    th.lm_head.weight = th.model.embed_tokens.weight  # tied, as released (the file has no lm_head)
    model = model.to(dev).eval()
    load_s = time.perf_counter() - t0
    tok = Qwen2TokenizerFast(tokenizer_file=os.path.join(a.dir, "tokenizer.json"), eos_token="<|im_end|>",
                             pad_token="<|endoftext|>", unk_token=None, bos_token=None)
    fe = WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, hop_length=160, n_fft=400, chunk_length=30)
    # the released tokenizer_config's extra special tokens, which the processor reads
    tok.audio_token, tok.audio_bos_token, tok.audio_eos_token = "<|audio_pad|>", "<|audio_start|>", "<|audio_end|>"
    proc = Qwen3ASRProcessor(feature_extractor=fe, tokenizer=tok)
    wav, rate = read_wav(a.wav)
    assert rate == 16000, f"{a.wav}: {rate} Hz (the reference path here takes 16 kHz)"
    secs = len(wav) / rate
    prompt = ("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>"
              "<|im_end|>\n<|im_start|>assistant\n")
    out = {"what": "asr", "load_s": load_s, "dtype": a.dtype, "device": dev, "audio_s": secs, "max_new": a.max_new,
           **v, "batches": []}
    ids_first = []  # the first sequence's new ids (batch 1: compare with anna-transcribe --print-ids)
    for b in [int(x) for x in a.batches.split(",")]:
        def run():
            inp = proc(text=[prompt] * b, audio=[wav] * b, return_tensors="pt", padding=True)
            inp = inp.to(dev)
            inp["input_features"] = inp["input_features"].to(dt)
            g = model.generate(**inp, max_new_tokens=a.max_new, min_new_tokens=a.max_new, do_sample=False)
            seq = g.sequences if hasattr(g, "sequences") else g
            n0 = inp["input_ids"].shape[1]
            ids_first[:] = seq[0, n0:].tolist()
            return int(seq.shape[1] - n0), int(n0)
        try:
            # batch 1 warms the kernels up; a bigger batch runs once (its cost is the point)
            s, (new, plen) = timed(run, dev, a.runs if b == 1 else 1, warmup=1 if b == 1 else 0)
        except torch.cuda.OutOfMemoryError as e:
            note(f"asr batch {b}: out of memory ({e})")
            out["batches"].append({"batch": b, "error": "out of memory"})
            torch.cuda.empty_cache()
            continue
        row = {"batch": b, "wall_s": s, "new_tokens": new, "prompt_tokens": plen, "audio_s_per_s": b * secs / s,
               "rtf_x": secs / s if b == 1 else None, "ids": list(ids_first) if b == 1 else None}
        note(f"asr batch {b}: {s:.3f} s, {new} new tokens each, {b * secs / s:.1f} audio-s/s")
        out["batches"].append(row)
        print(json.dumps(out), flush=True)  # after each batch: a timeout keeps what was done
    return 0


# ----------------------------------------------------------------------------- TTS

def cmd_tts(a):
    import torch
    stub_package("qwen_tts", ("", "/core"))
    class NoSpeechTokenizer:  # from_pretrained loads the codec wrapper; the decoder is built below
        @classmethod
        def from_pretrained(cls, *args, **kw):
            return None

    for name in ("qwen_tts.inference", "qwen_tts.inference.qwen3_tts_tokenizer"):
        m = types.ModuleType(name)
        m.__path__ = []
        m.Qwen3TTSTokenizer = NoSpeechTokenizer
        sys.modules[name] = m
    v = versions()  # transformers first: it probes for librosa at import
    if importlib.util.find_spec("librosa") is None:  # only the Base speaker encoder's mel uses it
        lib, filt = types.ModuleType("librosa"), types.ModuleType("librosa.filters")

        def mel(**kw):
            raise RuntimeError("librosa stub: the speaker encoder is not part of this benchmark")
        filt.mel = mel
        lib.filters = filt
        sys.modules["librosa"], sys.modules["librosa.filters"] = lib, filt
    note(f"tts reference: torch {v['torch']}, transformers {v['transformers']} ({v['transformers_path']})")
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder
    from safetensors.torch import load_file
    from transformers import PreTrainedTokenizerFast
    torch.set_grad_enabled(False)
    dev, dt = a.device, dtype_of(a.dtype)
    t0 = time.perf_counter()
    model = Qwen3TTSForConditionalGeneration.from_pretrained(a.dir, dtype=dt, attn_implementation="sdpa").to(dev).eval()
    cdir = os.path.join(a.dir, "speech_tokenizer")
    ccfg = Qwen3TTSTokenizerV2Config(**{k: v for k, v in json.load(open(os.path.join(cdir, "config.json"))).items()
                                        if k not in ("architectures", "model_type")})
    dcfg = ccfg.decoder_config
    dcfg._attn_implementation = "sdpa"
    dec = Qwen3TTSTokenizerV2Decoder(dcfg)
    sd = {k[len("decoder."):]: t for k, t in load_file(os.path.join(cdir, "model.safetensors")).items()}
    missing, unexpected = dec.load_state_dict(sd, strict=False)
    if missing or unexpected:
        note(f"tts codec: missing {missing[:4]} unexpected {unexpected[:4]}")
    dec = dec.to(dev, torch.float32 if a.codec_f32 else dt).eval()
    load_s = time.perf_counter() - t0
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(a.dir, "tokenizer.json"))
    ids = tok(f"<|im_start|>assistant\n{a.text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    greedy = None
    if a.greedy_frames:  # greedy codes of one utterance, to compare with anna-speak --greedy --print-codes
        codes, _ = model.generate(input_ids=[torch.tensor([ids], device=dev)], languages=["english"],
                                  speakers=[a.voice], non_streaming_mode=True, max_new_tokens=a.greedy_frames,
                                  do_sample=False, subtalker_dosample=False)
        greedy = codes[0].tolist()
        if a.greedy_only:
            print(json.dumps({"what": "tts_greedy", "codes": greedy}), flush=True)
            return 0
    # warm-up (kernels, allocator) on a few frames: a full-length one would double the time
    model.generate(input_ids=[torch.tensor([ids], device=dev)], languages=["english"], speakers=[a.voice],
                   non_streaming_mode=True, max_new_tokens=4)
    dec.chunked_decode(torch.zeros(1, 16, 4, dtype=torch.long, device=dev), chunk_size=300, left_context_size=25)
    out = {"what": "tts", "load_s": load_s, "dtype": a.dtype, "device": dev, "text_tokens": len(ids),
           "max_frames": a.frames, **v, "greedy_codes": greedy, "batches": []}
    for b in [int(x) for x in a.batches.split(",")]:
        def run():
            x = [torch.tensor([ids], device=dev)] * b
            codes, _ = model.generate(input_ids=x, languages=["english"] * b, speakers=[a.voice] * b,
                                      non_streaming_mode=True, max_new_tokens=a.frames)
            frames = [int(c.shape[0]) for c in codes]
            wavs = []
            for c in codes:  # the package decodes one utterance at a time (tokenizer.decode)
                w = dec.chunked_decode(c.T.unsqueeze(0).long().to(dev), chunk_size=300, left_context_size=25)
                wavs.append(w.shape[-1])
            return frames, wavs
        try:
            s, (frames, samples) = timed(run, dev, a.runs if b == 1 else 1, warmup=0)
        except torch.cuda.OutOfMemoryError as e:
            out["batches"].append({"batch": b, "error": "out of memory"})
            note(f"tts batch {b}: out of memory ({e})")
            continue
        audio = [n / 24000 for n in samples]
        row = {"batch": b, "wall_s": s, "frames": frames if b <= 4 else [min(frames), max(frames)],
               "audio_s_mean": float(np.mean(audio)), "first_audio_ms": s * 1e3,
               "rtf_x_per_stream": float(np.mean(audio)) / s, "realtime_streams": int(sum(x / s >= 1 for x in audio))}
        note(f"tts batch {b}: {s:.3f} s for {np.mean(audio):.2f} s of audio per stream "
             f"(x{np.mean(audio) / s:.2f} real time per stream); no streaming: first audio = whole")
        out["batches"].append(row)
        print(json.dumps(out), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("inputs")
    p.add_argument("out")
    p.add_argument("--seconds", type=float, default=10.0)
    for name in ("vision", "asr", "tts"):
        p = sub.add_parser(name)
        p.add_argument("dir")
        p.add_argument("--device", default="cuda")
        p.add_argument("--dtype", default="bf16", choices=["bf16", "f32", "f16"])
        p.add_argument("--runs", type=int, default=1 if name == "tts" else 3)
        if name == "vision":
            p.add_argument("--images", required=True)
        if name == "asr":
            p.add_argument("--wav", required=True)
            p.add_argument("--max-new", type=int, default=32)
            p.add_argument("--batches", default="1,32,128")
        if name == "tts":
            p.add_argument("--text", default="Hello there, this is a benchmark of streaming speech synthesis.")
            p.add_argument("--voice", default="ryan")
            p.add_argument("--frames", type=int, default=50)
            p.add_argument("--batches", default="1,16")
            p.add_argument("--codec-f32", action="store_true", help="run the codec decoder in f32")
            p.add_argument("--greedy-frames", type=int, default=0,
                           help="first the greedy codes of N frames (N - 1 come out; JSON greedy_codes)")
            p.add_argument("--greedy-only", action="store_true", help="with --greedy-frames: only those, then exit")
    a = ap.parse_args()
    return {"inputs": cmd_inputs, "vision": cmd_vision, "asr": cmd_asr, "tts": cmd_tts}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
