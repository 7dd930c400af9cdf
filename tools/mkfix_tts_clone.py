#!/usr/bin/env python3
"""mkfix_tts_clone.py: a shrunk random Qwen3-TTS Base checkpoint (voice cloning) for test_tts_clone.c.

    ~/.cache/anna/venvs/tts/bin/python tools/mkfix_tts_clone.py

tests/fixtures/qwen3_tts_clone/: config.json (tts_model_type "base", the qwen3_tts talker config,
speaker_encoder_config shrunk: channels [32, 32, 32, 32, 96], kernels [5, 3, 3, 3, 1], dilations
[1, 2, 3, 4, 1], attention 16, res2net scale 4, SE 8, enc_dim 16 = the talker's hidden size),
model.safetensors (the qwen3_tts talker weights plus seeded random `speaker_encoder.*`, f32),
generation_config.json (symlink), ref.wav (a 1.6-s 24 kHz float WAV: a chirp with harmonics and
seeded noise; decoded exactly), and the reference (qwen-tts 0.1.1) outputs:
  ref.mel.f32   mel_spectrogram(...) of ref.wav as extract_speaker_embedding computes it, [L][128]
  xvec.f32      extract_speaker_embedding(ref.wav, 24000): the x-vector [16]
  cases.json    per case: text, language, ids, n_prefill, max_new_tokens, frames
  prefill_logits_K.f32 / codes_K.i32: generate with voice_clone_prompt x_vector_only_mode (the
                x-vector in place of a preset speaker's row), greedy as mkfix_tts.py
  cli_codes_K.txt: codes_K as anna-speak --print-codes prints them
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mkfix_tts  # noqa: E402

FIX = os.path.join(HERE, "..", "tests", "fixtures")
OUT = os.path.join(FIX, "qwen3_tts_clone")
SPK = {"mel_dim": 128, "enc_dim": 16, "enc_channels": [32, 32, 32, 32, 96], "enc_kernel_sizes": [5, 3, 3, 3, 1],
       "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 16, "enc_res2net_scale": 4,
       "enc_se_channels": 8, "sample_rate": 24000}
CASES = [("Hello there, this is a test.", "English", 12), ("Good morning!", "auto", 9)]


def ref_clip():
    sr, n = 24000, 38400
    t = np.arange(n) / sr
    f = 180 + 120 * t
    x = 0.3 * np.sin(2 * np.pi * np.cumsum(f) / sr) + 0.12 * np.sin(4 * np.pi * np.cumsum(f) / sr)
    x *= 0.6 + 0.4 * np.sin(2 * np.pi * 3 * t)
    x += 0.01 * np.random.default_rng(7).standard_normal(n)
    return x.astype(np.float32)


def main():
    import soundfile as sf
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer
    Config, Model = mkfix_tts.import_model()
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram
    os.makedirs(OUT, exist_ok=True)
    base = os.path.join(FIX, "qwen3_tts")
    conf = json.load(open(os.path.join(base, "config.json")))
    conf["tts_model_type"] = "base"
    conf["speaker_encoder_config"] = SPK
    for k in ("spk_id", "spk_is_dialect"):
        conf["talker_config"].pop(k, None)
    cfg = Config(**{k: v for k, v in conf.items() if k not in ("architectures", "model_type")})
    cfg.talker_config._attn_implementation = "eager"
    cfg.talker_config.code_predictor_config._attn_implementation = "eager"
    cfg._attn_implementation = "eager"
    cfg.talker_config.spk_id, cfg.talker_config.spk_is_dialect = {}, {}
    model = Model(cfg).float().eval()
    stored = load_file(os.path.join(base, "model.safetensors"))
    sd = {k: v.float() for k, v in stored.items()}
    g = torch.Generator().manual_seed(31)
    with torch.no_grad():
        for name, p in model.speaker_encoder.named_parameters():
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * 1.5 / np.sqrt(fan_in))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all(k.startswith("speaker_encoder.") for k in missing), (missing[:5], unexpected[:5])
    # the talker as stored in qwen3_tts (bf16 matrices: the values the reference runs), the
    # speaker encoder f32
    tensors = {k: (stored[k] if k in stored else v.detach().contiguous()) for k, v in model.state_dict().items()}
    save_file(tensors, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
    link = os.path.join(OUT, "generation_config.json")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.join("..", "qwen3_tts", "generation_config.json"), link)

    wav = ref_clip()
    sf.write(os.path.join(OUT, "ref.wav"), wav, 24000, subtype="FLOAT")
    with torch.no_grad():
        mel = mel_spectrogram(torch.from_numpy(wav).unsqueeze(0), n_fft=1024, num_mels=128, sampling_rate=24000,
                              hop_size=256, win_size=1024, fmin=0, fmax=12000).transpose(1, 2)
        mel[0].numpy().astype("<f4").tofile(os.path.join(OUT, "ref.mel.f32"))
        xvec = model.extract_speaker_embedding(wav, 24000)
    xvec.float().numpy().astype("<f4").tofile(os.path.join(OUT, "xvec.f32"))
    print("mel", tuple(mel.shape), "xvec", xvec.numpy().round(4).tolist())

    tok = AutoTokenizer.from_pretrained(os.path.expanduser("~/.cache/anna/tokenizers/qwen2.5"))
    tc = model.talker
    cases = []
    for k, (text, lang, max_new) in enumerate(CASES):
        ids = tok(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n",
                  add_special_tokens=False)["input_ids"]
        seen = {}

        def hook(mod, args, kw, r):
            e = kw.get("inputs_embeds")
            if e is not None and e.shape[1] > 1 and "logits" not in seen:
                seen["logits"] = r.logits[0].detach().float().numpy().copy()
                seen["n"] = e.shape[1]

        h = tc.register_forward_hook(hook, with_kwargs=True)
        vcp = dict(ref_code=[None], ref_spk_embedding=[xvec], x_vector_only_mode=[True], icl_mode=[False])
        with torch.no_grad():
            codes, _ = model.generate(input_ids=[torch.tensor([ids])], voice_clone_prompt=vcp, languages=[lang],
                                      speakers=[None], non_streaming_mode=True, max_new_tokens=max_new,
                                      do_sample=False, subtalker_dosample=False, repetition_penalty=1.05)
        h.remove()
        c = codes[0].numpy().astype(np.int32)
        seen["logits"].astype(np.float32).tofile(os.path.join(OUT, f"prefill_logits_{k}.f32"))
        c.tofile(os.path.join(OUT, f"codes_{k}.i32"))
        with open(os.path.join(OUT, f"cli_codes_{k}.txt"), "w") as f:
            f.write("".join(",".join(map(str, r)) + "\n" for r in c))
        cases.append({"text": text, "language": lang, "ids": ids, "n_prefill": seen["n"], "max_new_tokens": max_new,
                      "frames": int(c.shape[0])})
        print(f"case {k}: prefill {seen['n']} rows, {c.shape[0]} frames, c0 {c[:, 0].tolist()}")
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)


if __name__ == "__main__":
    main()
