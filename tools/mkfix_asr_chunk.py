#!/usr/bin/env python3
"""Builds tests/fixtures/qwen3_asr/long: a long clip and qwen-asr 0.0.6's own chunking and
joining of it, for tests/media/test_asr_chunk.c and the cli_transcribe_chunks test.

    ~/.cache/anna/venvs/asr/bin/python tools/mkfix_asr_chunk.py [OUT_DIR]
        (default tests/fixtures/qwen3_asr/long; needs tests/fixtures/qwen3_asr from mkfix_asr.py)

long.wav: 16 kHz mono float WAV (decoded exactly, no resampling) of the audio fixtures' 16 kHz
samples (tests/fixtures/audio/*.wav16k.f32) laid end to end with gaps of digital silence and of
low seeded noise (so boundaries fall both on exact zeros and on the quietest noise window).
cli.txt: what anna-transcribe --print-ids --max-new 8 --chunk-seconds 6 prints for long.wav.
expected.json:
  splits: for each chunk length (seconds), qwen_asr.inference.utils.split_audio_into_chunks'
          pieces [start, n, n_padded] (start from the offsets, n_padded from the returned arrays)
  model:  for chunk length MODEL_CHUNK, each piece through the fixture model (tests/fixtures/
          qwen3_asr: same windowed encoder as mkfix_asr.py): greedy ids by full forwards, up to
          N_GEN or the first <|im_end|> / <|endoftext|> (kept), the raw text (the ids before the
          stop decoded with special tokens kept, as anna-transcribe renders it), then
          qwen-asr's parse_asr_output + "".join + merge_languages over the pieces: text, language
  parse:  parse_asr_output on hand-made raw strings (white space, tags, "language None",
          repeated characters and patterns), forced and not: [raw, forced, language, text]
"""
import json
import os
import sys

import numpy as np
import soundfile as sf
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "fixtures")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(FIX, "qwen3_asr", "long")
ASR = os.path.join(FIX, "qwen3_asr")
CHUNKS = (5.5, 6.0, 8.0)
MODEL_CHUNK = 6.0
N_GEN = 8
IDS = dict(endoftext=0, im_start=1, im_end=2, audio_pad=1002)


def long_clip():
    clips = {n: np.fromfile(os.path.join(FIX, "audio", n + ".wav16k.f32"), dtype="<f4")
             for n in ("sweep_8k_mono", "bursts_48k_stereo", "bursts_44k_mp3", "loud_22k_float")}
    rng = np.random.default_rng(26)
    zeros = lambda s: np.zeros(int(s * 16000), np.float32)
    noise = lambda s, a: (a * rng.standard_normal(int(s * 16000))).astype(np.float32)
    parts = [clips["sweep_8k_mono"], noise(0.7, 3e-3), clips["bursts_48k_stereo"], clips["loud_22k_float"],
             zeros(0.6), clips["bursts_44k_mp3"], clips["sweep_8k_mono"], noise(0.5, 2e-3),
             clips["bursts_48k_stereo"], clips["sweep_8k_mono"], clips["loud_22k_float"], noise(0.4, 1e-3),
             clips["bursts_44k_mp3"], zeros(0.9), clips["sweep_8k_mono"], clips["bursts_48k_stereo"],
             noise(0.3, 4e-3), clips["loud_22k_float"], clips["sweep_8k_mono"], clips["bursts_44k_mp3"][:4000]]
    return np.concatenate(parts).astype(np.float32)


PARSE_CASES = [
    ("language English<asr_text> hello world  ", False),
    ("  language chinese<asr_text>你好\u3000", False),
    ("language None<asr_text>", False),
    ("language None<asr_text> stray ", False),
    ("no tag here\n", False),
    ("\n\nlanguage fRENCH\nmore<asr_text>bonjour", False),
    ("language English<asr_text>" + "a" * 25 + "b", False),
    ("language English<asr_text>x" + "ab" * 22 + "c" + "xyz" * 21, False),
    (" forced text " + "na" * 30, True),
    ("language English<asr_text>keep", True),
    ("\u00a0\u2003", False),
    ("", False),
]


def write_cli(meta):
    """cli.txt: what `anna-transcribe --print-ids --max-new N_GEN --chunk-seconds MODEL_CHUNK
    long.wav` prints: each piece's ids (through the stop id), then the joined text."""
    m = meta["model"]
    with open(os.path.join(OUT, "cli.txt"), "w") as f:
        for p in m["pieces"]:
            f.write(",".join(str(t) for t in p["ids"]) + "\n")
        f.write(m["text"] + "\n")


def main():
    from qwen_asr.inference import utils as qu
    from qwen_asr.core.transformers_backend.configuration_qwen3_asr import Qwen3ASRConfig
    from qwen_asr.core.transformers_backend import modeling_qwen3_asr as mq
    from safetensors.torch import load_file
    from tokenizers import Tokenizer
    from transformers import WhisperFeatureExtractor

    torch.set_grad_enabled(False)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "long.wav")
    sf.write(path, long_clip(), 16000, subtype="FLOAT")
    wav = qu.normalize_audio_input(path)  # as transcribe() loads it
    meta = dict(file="long.wav", n=int(wav.shape[0]), seconds=wav.shape[0] / 16000, splits={})
    for cs in CHUNKS:
        parts = qu.split_audio_into_chunks(wav=wav, sr=16000, max_chunk_sec=cs)
        rows, start = [], 0
        for cw, off in parts:
            st = int(round(off * 16000))
            rows.append([st, None, int(cw.shape[0])])
        for i in range(len(rows)):
            end = rows[i + 1][0] if i + 1 < len(rows) else meta["n"]
            rows[i][1] = end - rows[i][0]
            assert np.array_equal(parts[i][0][:rows[i][1]], wav[rows[i][0]:end])
        meta["splits"][str(cs)] = rows
        print(cs, rows)

    # the fixture model, as mkfix_asr.py runs it (block-diagonal encoder windows)
    layer_fwd = mq.Qwen3ASRAudioEncoderLayer.forward

    def windowed(self, hidden_states, cu_seqlens, attention_mask=None, **kw):
        if attention_mask is None:
            n = hidden_states.shape[0]
            attention_mask = torch.full([1, 1, n, n], torch.finfo(hidden_states.dtype).min)
            for i in range(1, len(cu_seqlens)):
                attention_mask[..., cu_seqlens[i - 1]:cu_seqlens[i], cu_seqlens[i - 1]:cu_seqlens[i]] = 0
        return layer_fwd(self, hidden_states, cu_seqlens, attention_mask, **kw)

    mq.Qwen3ASRAudioEncoderLayer.forward = windowed
    cfg = json.load(open(os.path.join(ASR, "config.json")))
    config = Qwen3ASRConfig(**{k: v for k, v in cfg.items() if k not in ("model_type", "architectures")})
    config.thinker_config.audio_config._attn_implementation = "eager"
    config.thinker_config.text_config._attn_implementation = "eager"
    config.thinker_config._attn_implementation = "eager"
    model = mq.Qwen3ASRForConditionalGeneration(config).eval().float()
    sd = load_file(os.path.join(ASR, "model.safetensors"))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    th = model.thinker
    th.lm_head.weight = th.model.embed_tokens.weight
    tok = Tokenizer.from_file(os.path.join(ASR, "tokenizer.json"))
    head = tok.encode("<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|>", add_special_tokens=False).ids
    tail = tok.encode("<|audio_end|><|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False).ids
    fe = WhisperFeatureExtractor(feature_size=128)
    parts = qu.split_audio_into_chunks(wav=wav, sr=16000, max_chunk_sec=MODEL_CHUNK)
    pieces, raws = [], []
    for cw, off in parts:
        f = fe(cw, sampling_rate=16000, padding=True, truncation=False, return_attention_mask=True,
               return_tensors="pt")
        feats = f["input_features"][0]
        L = feats.shape[1]
        N = th.audio_tower(feats, feature_lens=torch.tensor([L])).last_hidden_state.shape[0]
        seq = head + [IDS["audio_pad"]] * N + tail
        fam = torch.ones(1, L, dtype=torch.long)
        gen = []
        for _ in range(N_GEN):
            s = torch.tensor([seq])
            lg = th(input_ids=s, attention_mask=torch.ones_like(s), input_features=feats[None],
                    feature_attention_mask=fam).logits[0, -1]
            nxt = int(torch.argmax(lg))
            gen.append(nxt)
            seq.append(nxt)
            if nxt in (IDS["im_end"], IDS["endoftext"]):
                break
        body = gen[:-1] if gen[-1] in (IDS["im_end"], IDS["endoftext"]) else gen
        raw = tok.decode(body, skip_special_tokens=False)
        raws.append(raw)
        pieces.append(dict(offset=off, frames=L, tokens=N, ids=gen, raw=raw))
        print(f"piece @{off:.3f}s L={L} N={N} ids {gen} raw {raw!r}")
    langs, texts = zip(*[qu.parse_asr_output(r, user_language=None) for r in raws])
    meta["model"] = dict(chunk_seconds=MODEL_CHUNK, n_gen=N_GEN, pieces=pieces, text="".join(texts),
                         language=qu.merge_languages(list(langs)))
    print("joined", repr(meta["model"]["text"]), repr(meta["model"]["language"]))
    meta["parse"] = []
    for raw, forced in PARSE_CASES:
        lang, text = qu.parse_asr_output(raw, user_language="English" if forced else None)
        meta["parse"].append([raw, forced, "" if forced else lang, text])
    write_cli(meta)
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
