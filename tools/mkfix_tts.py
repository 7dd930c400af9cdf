#!/usr/bin/env python3
"""mkfix_tts.py: a shrunk random-weight Qwen3-TTS CustomVoice model (talker + code predictor)
and the reference's prefill logits and greedy codes, for tests/engine/test_tts.c.

Runs qwen-tts 0.1.1's Qwen3TTSForConditionalGeneration (transformers 4.57.3):
    ~/.cache/anna/venvs/tts/bin/python tools/mkfix_tts.py tests/fixtures/qwen3_tts
Only the model modules are imported (the package __init__ pulls onnxruntime, sox, ...).

Shrunk config, CustomVoice layout (config.json talker_config + code_predictor_config, tensors
`talker.*`): talker = Qwen3 of 2 layers, hidden 16, 4 q / 2 kv heads, explicit head_dim 8,
mrope section [2,1,1] interleaved (as released: all three axes get the same positions);
codec vocab 3072 with the released control ids; text vocab 151936 (so real Qwen ids, including
tts_pad/bos/eos 151671..151673, index it) at text_hidden_size 4 to stay small. Code predictor:
2 layers, hidden 12 != 16 (so small_to_mtp_projection exists, the 1.7B layout), 15 codec
embeddings and 15 heads over a codebook shrunk to 256 entries (the predictor's vocab_size;
the released one is 2048). Matrices are stored bf16 (rounded before the reference runs, so
both sides use the same values), norms and biases f32.

Text ids: the Qwen2.5 tokenizer at ~/.cache/anna/tokenizers/qwen2.5 (the same BPE and chat
specials as Qwen3's for these texts), not stored in the fixture (11 MB): cases.json holds the ids.

Writes config.json, model.safetensors, cases.json ({text, speaker, language, ids, n_prefill,
frames}) and per case k: prefill_logits_k.f32 (codec_head over the non-streaming CustomVoice
prompt's prefill rows: [n_prefill, 3072] for case 0, the last row only for the others) and codes_k.i32 ([frames, 16], greedy talker
and predictor, the wrapper's defaults otherwise: repetition_penalty 1.05, min_new_tokens 2,
ids 2048..3071 but eos suppressed; stops at codec eos or max_new_tokens).
"""
import importlib.util
import json
import os
import sys
import types

import numpy as np
import torch

SPEAKERS = {"vivian": 3000, "ryan": 3001, "eric": 3002}
DIALECT = {"vivian": False, "ryan": False, "eric": "sichuan_dialect"}
LANGS = {"english": 2050, "chinese": 2055, "sichuan_dialect": 2062}

TALKER = {
    "vocab_size": 3072, "hidden_size": 16, "intermediate_size": 40, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "rope_scaling": {"interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default", "type": "default"},
    "attention_bias": False, "use_sliding_window": False, "num_code_groups": 16,
    "text_hidden_size": 4, "text_vocab_size": 151936,
    "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149,
    "spk_id": SPEAKERS, "spk_is_dialect": DIALECT, "codec_language_id": LANGS,
}
PREDICTOR = {
    "vocab_size": 256, "hidden_size": 12, "intermediate_size": 28, "num_hidden_layers": 2,
    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "hidden_act": "silu",
    "max_position_embeddings": 65536, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "attention_bias": False, "use_sliding_window": False, "num_code_groups": 16,
}
EOS_BOOST = 3.0
CASES = [("Hello there, this is a test.", "Ryan", "English", 12),
         ("Good morning!", "Eric", "Chinese", 9),
         ("Vivian speaks, language auto.", "vivian", "auto", 10)]


def import_model():
    spec = importlib.util.find_spec("qwen_tts")
    root = spec.submodule_search_locations[0]
    for name, sub in (("qwen_tts", ""), ("qwen_tts.core", "/core")):
        m = types.ModuleType(name)
        m.__path__ = [root + sub]
        sys.modules[name] = m
    # the modeling module imports the speech-tokenizer wrapper (whole package); unused here
    for name in ("qwen_tts.inference", "qwen_tts.inference.qwen3_tts_tokenizer"):
        m = types.ModuleType(name)
        m.__path__ = []
        m.Qwen3TTSTokenizer = object
        sys.modules[name] = m
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSConfig
    from qwen_tts.core.models.modeling_qwen3_tts import Qwen3TTSForConditionalGeneration
    return Qwen3TTSConfig, Qwen3TTSForConditionalGeneration


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/qwen3_tts"
    os.makedirs(out, exist_ok=True)
    Config, Model = import_model()
    torch.manual_seed(26)
    talker = dict(TALKER, code_predictor_config=PREDICTOR)
    conf = {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
        "tts_model_type": "custom_voice", "tts_model_size": "0b6", "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "im_start_token_id": 151644, "im_end_token_id": 151645,
        "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
        "talker_config": talker, "speaker_encoder_config": {"enc_dim": 16, "sample_rate": 24000},
    }
    cfg = Config(**{k: v for k, v in conf.items() if k not in ("architectures", "model_type")})
    cfg.talker_config._attn_implementation = "eager"
    cfg.talker_config.code_predictor_config._attn_implementation = "eager"
    cfg._attn_implementation = "eager"
    model = Model(cfg).float().eval()

    g = torch.Generator().manual_seed(2026)
    bf16 = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else p.numel()
                scale = 1.0 if "embedding" in name else fan_in ** -0.5
                if name.endswith("codec_head.weight") or ".lm_head." in name:
                    scale *= 3.0  # peaked logits: greedy picks are far from ties
                p.copy_((torch.randn(p.shape, generator=g) * scale).to(torch.bfloat16).float())
                bf16[name] = True
        # a stronger eos row (x3): case 0 ends on codec eos (the stop path), the others run to max_new_tokens
        head = model.talker.codec_head.weight
        head[TALKER["codec_eos_token_id"]] = (head[TALKER["codec_eos_token_id"]] * EOS_BOOST).to(torch.bfloat16).float()

    tensors = {}
    for name, p in model.state_dict().items():
        t = p.detach().contiguous()
        tensors[name] = t.to(torch.bfloat16) if bf16.get(name) else t
    from safetensors.torch import save_file
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(conf, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
                   "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
                   "subtalker_temperature": 0.9, "max_new_tokens": 8192}, f, indent=2)

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.expanduser("~/.cache/anna/tokenizers/qwen2.5"))
    cases = []
    tc = model.talker
    for k, (text, spk, lang, max_new) in enumerate(CASES):
        chat = f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
        ids = tok(chat, add_special_tokens=False)["input_ids"]
        input_id = torch.tensor([ids], dtype=torch.long)
        # prefill logits: capture the talker's prefill call (inputs_embeds with more than one row)
        seen = {}

        def hook(mod, args, kw, r):
            e = kw.get("inputs_embeds")
            if e is not None and e.shape[1] > 1 and "logits" not in seen:
                seen["logits"] = r.logits[0].detach().float().numpy().copy()
                seen["n"] = e.shape[1]

        h = tc.register_forward_hook(hook, with_kwargs=True)
        with torch.no_grad():
            codes, _ = model.generate(input_ids=[input_id], languages=[lang], speakers=[spk], non_streaming_mode=True,
                                      max_new_tokens=max_new, do_sample=False, subtalker_dosample=False,
                                      repetition_penalty=1.05)
        h.remove()
        c = codes[0].numpy().astype(np.int32)
        lg = seen["logits"] if k == 0 else seen["logits"][-1:]  # size: every row of case 0 only
        lg.astype(np.float32).tofile(os.path.join(out, f"prefill_logits_{k}.f32"))
        c.tofile(os.path.join(out, f"codes_{k}.i32"))
        cases.append({"text": text, "speaker": spk, "language": lang, "ids": ids, "n_prefill": seen["n"],
                      "max_new_tokens": max_new, "frames": int(c.shape[0])})
        print(f"case {k}: {len(ids)} ids, prefill {seen['n']} rows, {c.shape[0]} frames, c0 {c[:, 0].tolist()}")
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)


if __name__ == "__main__":
    main()
