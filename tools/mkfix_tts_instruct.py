#!/usr/bin/env python3
"""mkfix_tts_instruct.py: instruction prompts of Qwen3-TTS (voice design, CustomVoice instruct)
on the random shrunk talker of tests/fixtures/qwen3_tts (tools/mkfix_tts.py), for test_tts.c.

    ~/.cache/anna/venvs/tts/bin/python tools/mkfix_tts_instruct.py

Writes two folders next to qwen3_tts, each a config.json variant plus a model.safetensors symlink to
../qwen3_tts/model.safetensors (same weights) and generation_config.json:
  qwen3_tts_design/    tts_model_type "voice_design" (no spk_id: the wrapper passes no speaker)
  qwen3_tts_instruct/  tts_model_type "custom_voice", tts_model_size "1b7" (the wrapper keeps
                       instructions for it; it drops them for "0b6")
and in each cases.json ({text, speaker, language, instruct, ids, instruct_ids, n_prefill,
max_new_tokens, frames}) with prefill_logits_K.f32 (every prefill row) and codes_K.i32 (greedy, as
mkfix_tts.py; cli_codes_K.txt: the same as anna-speak --print-codes prints them). The reference runs Qwen3TTSForConditionalGeneration.generate with instruct_ids as
the wrapper builds them: the Qwen2.5 tokenizer over `<|im_start|>user\\n{instruct}<|im_end|>\\n`
(qwen-tts 0.1.1 _build_instruct_text).
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
VARIANTS = {
    "qwen3_tts_design": (dict(tts_model_type="voice_design", tts_model_size="1b7"), [
        ("Hello there, this is a test.", "", "English", "A calm, deep male voice, speaking slowly.", 12),
        ("Good morning!", "", "auto", "Cheerful young woman", 9)]),
    "qwen3_tts_instruct": (dict(tts_model_type="custom_voice", tts_model_size="1b7"), [
        ("Hello there, this is a test.", "Ryan", "English", "Speak in a whisper.", 12),
        ("Good morning!", "Eric", "Chinese", "very happy", 9)]),
}


def main():
    Config, Model = mkfix_tts.import_model()
    from safetensors.torch import load_file
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.expanduser("~/.cache/anna/tokenizers/qwen2.5"))
    base = os.path.join(FIX, "qwen3_tts")
    conf0 = json.load(open(os.path.join(base, "config.json")))
    sd = {k: v.float() for k, v in load_file(os.path.join(base, "model.safetensors")).items()}
    for name, (over, cases_in) in VARIANTS.items():
        out = os.path.join(FIX, name)
        os.makedirs(out, exist_ok=True)
        conf = json.loads(json.dumps(conf0))
        conf.update(over)
        if over["tts_model_type"] == "voice_design":
            conf["talker_config"].pop("spk_id")
            conf["talker_config"].pop("spk_is_dialect")
        cfg = Config(**{k: v for k, v in conf.items() if k not in ("architectures", "model_type")})
        cfg.talker_config._attn_implementation = "eager"
        cfg.talker_config.code_predictor_config._attn_implementation = "eager"
        cfg._attn_implementation = "eager"
        if over["tts_model_type"] == "voice_design":  # generate() reads these for a speaker only
            cfg.talker_config.spk_id, cfg.talker_config.spk_is_dialect = {}, {}
        model = Model(cfg).float().eval()
        missing, unexpected = model.load_state_dict(sd, strict=False)
        assert not unexpected and not [k for k in missing if k.startswith("talker.")], (missing, unexpected)
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(conf, f, indent=2)
        for fn in ("model.safetensors", "generation_config.json"):
            link = os.path.join(out, fn)
            if os.path.lexists(link):
                os.remove(link)
            os.symlink(os.path.join("..", "qwen3_tts", fn), link)
        tc = model.talker
        cases = []
        for k, (text, spk, lang, instruct, max_new) in enumerate(cases_in):
            ids = tok(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n",
                      add_special_tokens=False)["input_ids"]
            ins = tok(f"<|im_start|>user\n{instruct}<|im_end|>\n", add_special_tokens=False)["input_ids"]
            seen = {}

            def hook(mod, args, kw, r):
                e = kw.get("inputs_embeds")
                if e is not None and e.shape[1] > 1 and "logits" not in seen:
                    seen["logits"] = r.logits[0].detach().float().numpy().copy()
                    seen["n"] = e.shape[1]

            h = tc.register_forward_hook(hook, with_kwargs=True)
            with torch.no_grad():
                codes, _ = model.generate(input_ids=[torch.tensor([ids])], instruct_ids=[torch.tensor([ins])],
                                          languages=[lang], speakers=[spk or None], non_streaming_mode=True,
                                          max_new_tokens=max_new, do_sample=False, subtalker_dosample=False,
                                          repetition_penalty=1.05)
            h.remove()
            c = codes[0].numpy().astype(np.int32)
            seen["logits"].astype(np.float32).tofile(os.path.join(out, f"prefill_logits_{k}.f32"))
            c.tofile(os.path.join(out, f"codes_{k}.i32"))
            with open(os.path.join(out, f"cli_codes_{k}.txt"), "w") as f:  # anna-speak --print-codes
                f.write("".join(",".join(map(str, r)) + "\n" for r in c))
            cases.append({"text": text, "speaker": spk, "language": lang, "instruct": instruct, "ids": ids,
                          "instruct_ids": ins, "n_prefill": seen["n"], "max_new_tokens": max_new,
                          "frames": int(c.shape[0])})
            print(f"{name} case {k}: {len(ins)} instruct ids, prefill {seen['n']} rows, {c.shape[0]} frames, "
                  f"c0 {c[:, 0].tolist()}")
        with open(os.path.join(out, "cases.json"), "w") as f:
            json.dump(cases, f, indent=1)


if __name__ == "__main__":
    main()
