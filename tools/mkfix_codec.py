#!/usr/bin/env python3
"""mkfix_codec.py: a random-weight Qwen3-TTS 12 Hz speech-tokenizer decoder (shrunk config)
and its reference PCM, for tests/engine/test_codec.c.

Runs the decoder class of the `qwen-tts` package (0.1.1, which pins transformers 4.57.3):
    python3 -m venv ~/.cache/anna/venvs/tts
    ~/.cache/anna/venvs/tts/bin/pip install qwen-tts==0.1.1   # torch, transformers 4.57.3
    ~/.cache/anna/venvs/tts/bin/python tools/mkfix_codec.py tests/fixtures/qwen3_tts_codec
Only the 12 Hz tokenizer modules are imported (the package's __init__ pulls onnxruntime, sox,
torchaudio for other parts, which the decoder does not use).

Shrunk config: every structural feature of the released decoder is kept (16 codebooks of 2048,
the split quantizer with its two output projections, pre_conv k3, a 3-layer pre-transformer
with GQA, an explicit head_dim != hidden/heads and a sliding window of 6 frames, both
ConvTranspose+ConvNeXt upsample stages, the four decoder blocks with the REAL upsample rates
8,5,4,3, so 1920 samples per frame); only widths shrink. Layer scales, ConvNeXt gammas and
SnakeBeta alpha/beta are randomised (their init values would hide them). Codebook sums are
stored as bf16 (the loader's conversion path); everything else f32.

Writes config.json + model.safetensors (checkpoint tensor names, decoder.* only: the encoder
is not needed to decode) and, for seeded random codes of 1, 7 and 40 frames, codes_N.i32
([N,16] int32) and pcm_N.f32 (one pass, decoder.forward), plus pcm_40_chunked.f32: the
reference's chunked_decode with chunk_size 16 and left_context_size 5 (the released 300/25
shrunk so that three chunks run).
"""
import json
import os
import sys
import types
import importlib.util

import numpy as np
import torch


def import_decoder():
    spec = importlib.util.find_spec("qwen_tts")
    root = spec.submodule_search_locations[0]
    for name, sub in (("qwen_tts", ""), ("qwen_tts.core", "/core")):
        m = types.ModuleType(name)
        m.__path__ = [root + sub]
        sys.modules[name] = m
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    return Qwen3TTSTokenizerV2Decoder, Qwen3TTSTokenizerV2Config


DECODER_CONFIG = {
    "codebook_size": 2048,
    "codebook_dim": 8,
    "hidden_size": 16,
    "latent_dim": 24,
    "max_position_embeddings": 8000,
    "rope_theta": 10000,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 6,
    "attention_bias": False,
    "sliding_window": 6,
    "intermediate_size": 20,
    "hidden_act": "silu",
    "layer_scale_initial_scale": 0.01,
    "rms_norm_eps": 1e-5,
    "num_hidden_layers": 3,
    "num_quantizers": 16,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 32,
    "attention_dropout": 0.0,
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/qwen3_tts_codec"
    os.makedirs(out, exist_ok=True)
    Decoder, Config = import_decoder()
    torch.manual_seed(26)
    cfg = Config(decoder_config=DECODER_CONFIG)
    dcfg = cfg.decoder_config
    dcfg._attn_implementation = "eager"
    dec = Decoder(dcfg).float().eval()

    g = torch.Generator().manual_seed(2026)
    with torch.no_grad():
        for name, p in dec.named_parameters():
            if name.endswith("cluster_usage"):
                p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.5)
                p[3] = 0.0  # clamp(min=1e-5) path
            elif name.endswith("embedding_sum"):
                v = torch.randn(p.shape, generator=g)
                v[3] *= 1e-5  # row whose usage is 0: stays finite after the clamp
                p.copy_(v.to(torch.bfloat16).float())
            elif name.endswith(".scale") or name.endswith("gamma"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.8 + 0.2)
            elif name.endswith("alpha") or name.endswith("beta"):
                p.copy_((torch.rand(p.shape, generator=g) - 0.5) * 1.0)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                p.copy_(torch.randn(p.shape, generator=g) / max(fan_in, 1) ** 0.5)
        # keep the waveform mostly inside the clamp so that the comparison sees real values:
        # centre and scale the last conv on a probe sequence (not one of the test sequences)
        probe = torch.randint(0, 2048, (1, 16, 9), generator=g)
        last = dec.decoder[-1].conv
        for _ in range(2):
            pre = dec.decoder[:-1]
            h = dec.quantizer.decode(probe)
            h = dec.pre_conv(h).transpose(1, 2)
            h = dec.pre_transformer(inputs_embeds=h).last_hidden_state.permute(0, 2, 1)
            for blocks in dec.upsample:
                for b in blocks:
                    h = b(h)
            for b in pre:
                h = b(h)
            y = last(torch.nn.functional.pad(h, (6, 0)))
            s = float(y.std())
            last.weight.mul_(0.35 / s)
            last.bias.sub_(float(y.mean()) * 0.35 / s)

    tensors = {}
    for name, p in dec.state_dict().items():
        t = p.detach().contiguous()
        if name.endswith("embedding_sum"):
            t = t.to(torch.bfloat16)
        tensors["decoder." + name] = t
    from safetensors.torch import save_file
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

    full = cfg.to_dict()
    conf = {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": 24000,
        "output_sample_rate": 24000,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
        "decoder_config": {k: full["decoder_config"][k] for k in DECODER_CONFIG},
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)

    rng = np.random.default_rng(126)
    with torch.no_grad():
        for n in (1, 7, 40):
            codes = rng.integers(0, 2048, size=(n, 16), dtype=np.int32)
            codes[0, :] = 3 if n == 7 else codes[0, :]  # the zero-usage row
            c = torch.from_numpy(codes.astype(np.int64)).T.unsqueeze(0)  # [1, 16, n]
            wav = dec(c)[0, 0].numpy().astype(np.float32)
            assert wav.shape[0] == n * 1920, wav.shape
            codes.tofile(os.path.join(out, f"codes_{n}.i32"))
            wav.tofile(os.path.join(out, f"pcm_{n}.f32"))
            clip = float(np.mean(np.abs(wav) >= 1.0))
            print(f"{n} frames: pcm rms {np.sqrt(np.mean(wav**2)):.4f} max {np.abs(wav).max():.4f} clipped {clip:.3f}")
            if n == 40:
                wch = dec.chunked_decode(c, chunk_size=16, left_context_size=5)[0, 0].numpy().astype(np.float32)
                wch.tofile(os.path.join(out, "pcm_40_chunked.f32"))
                print(f"chunked vs one pass: max |diff| {np.abs(wch - wav).max():.3e}")


if __name__ == "__main__":
    main()
