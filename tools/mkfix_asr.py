#!/usr/bin/env python3
"""Builds tests/fixtures/qwen3_asr: a shrunk random Qwen3-ASR (qwen-asr 0.0.6's classes) in the
released checkpoint layout, and the reference's outputs for tests/engine/test_asr.c.

    ~/.cache/anna/venvs/asr/bin/python tools/mkfix_asr.py [OUT_DIR]   (default tests/fixtures/qwen3_asr)
    ... tools/mkfix_asr.py --shape 0.6b|1.7b OUT_DIR [FRAMES [THREADS]]   (bench: see bench_shape)

Model (config.json: model_type qwen3_asr, thinker_config {audio_config, text_config, ids}):
  audio encoder d 64, 2 layers, 2 heads, ffn 128, conv hidden 16, n_window 50 (1-s chunks of
  100 frames -> 13 tokens), n_window_infer 100: attention windows of 13 tokens (1 s), so a 1.5-2 s
  clip has two windows and the block-diagonal mask matters (the reference's eager path ignores
  the windows: see `windowed` below; ASR_FULL_ATTENTION=1 writes the unwindowed outputs);
  output_dim 48.
  text decoder: Qwen3 (model_type qwen3_asr_text), hidden 48, 2 layers, 4 q / 2 kv heads of 16,
  ffn 96, vocab 1004, rope theta 1e6 with the released rope_scaling shape (mrope_section
  interleaved, a no-op with equal positions), tied embeddings: `thinker.lm_head.weight` is NOT
  saved (the loader must tie it), the reference runs with lm_head = embed_tokens.
  Ids are remapped into the small vocabulary (the released ones are 151643..151704):
  IDS below; audio_token_id / audio_start_token_id / audio_end_token_id in thinker_config carry
  the remapped values.
Weights: seeded normal, linear weights 2 N / sqrt(fan_in), embeddings N, biases 0.1 N, norm weights
1 + 0.1 N (gain 2: with gain 1 every clip decodes one repeated id; EMB_STD / LIN_GAIN override), f32,
one model.safetensors with `thinker.audio_tower.*`, `thinker.model.*`.
Per clip (reference features tests/fixtures/audio/<clip>.mel.f32, [128, L] mel-major):
  <clip>.enc.f32     audio tower output (after proj2) [N, 48]
  <clip>.logits.f32  thinker logits for every prompt row [n_prompt, 1004]
  expected.json      prompt ids, N, greedy ids (8 tokens: argmax of full forwards, no eos stop)
  <clip>.cli.txt     what `anna-transcribe --print-ids --max-new 8` prints for the clip's encoded file
The prompt is the ASR chat prompt (empty context) tokenized with tokenizer.json: the shared test
tokenizer (../shared/fixtures/tokenizer) with <|audio_start|> <|audio_end|> <|audio_pad|> <asr_text>
added as ids 1000-1003 (the text vocabulary is 1004).
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "qwen3_asr")
AUDIO = os.path.join(HERE, "..", "tests", "fixtures", "audio")
CLIPS = ("sweep_8k_mono", "bursts_44k_mp3", "bursts_48k_stereo")
TOKENIZER = os.path.join(HERE, "..", "..", "shared", "fixtures", "tokenizer")
# The shared 1000-id test tokenizer has <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2; the audio
# specials are appended as added tokens 1000-1003 (tokenizer.json written here).
AUDIO_SPECIALS = ("<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<asr_text>")
IDS = dict(endoftext=0, im_start=1, im_end=2, audio_start=1000, audio_end=1001, audio_pad=1002, asr_text=1003)
PROMPT_HEAD = "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n<|audio_start|>"
PROMPT_TAIL = "<|audio_end|><|im_end|>\n<|im_start|>assistant\n"
# clip -> the encoded file it came from (for anna-transcribe's test)
FILES = dict(sweep_8k_mono="sweep_8k_mono.wav", bursts_44k_mp3="bursts_44k.mp3",
             bursts_48k_stereo="bursts_48k_stereo.flac")
N_GEN = 8
EMB_STD = float(os.environ.get("EMB_STD", "1.0"))
LIN_GAIN = float(os.environ.get("LIN_GAIN", "2"))

AUDIO_CFG = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128, d_model=64,
                 n_window=50, n_window_infer=100, downsample_hidden_size=16, output_dim=48,
                 max_source_positions=1500, activation_function="gelu", conv_chunksize=500, dropout=0,
                 attention_dropout=0, activation_dropout=0, scale_embedding=False)
TEXT_CFG = dict(model_type="qwen3_asr_text", vocab_size=1004, hidden_size=48, intermediate_size=96,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
                rope_scaling={"interleaved": True, "mrope_interleaved": True, "mrope_section": [4, 2, 2],
                              "rope_type": "default", "type": "default"},
                attention_bias=False, tie_word_embeddings=True, use_cache=True)


def write_tokenizer():
    """OUT/tokenizer.json (+ tokenizer_config.json): the shared test tokenizer plus the audio specials."""
    import shutil
    from tokenizers import Tokenizer
    tj = json.load(open(os.path.join(TOKENIZER, "tokenizer.json")))
    for k, piece in enumerate(AUDIO_SPECIALS):
        tj["added_tokens"].append(dict(id=1000 + k, content=piece, single_word=False, lstrip=False, rstrip=False,
                                       normalized=False, special=True))
    with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    shutil.copy(os.path.join(TOKENIZER, "tokenizer_config.json"), os.path.join(OUT, "tokenizer_config.json"))
    tok = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    for name, i in IDS.items():
        piece = {"endoftext": "<|endoftext|>", "im_start": "<|im_start|>", "im_end": "<|im_end|>"}.get(name)
        piece = piece or AUDIO_SPECIALS[i - 1000]
        assert tok.token_to_id(piece) == i, (piece, tok.token_to_id(piece), i)
    return tok


def prompt_ids(tok, n_audio):
    head = tok.encode(PROMPT_HEAD, add_special_tokens=False).ids
    tail = tok.encode(PROMPT_TAIL, add_special_tokens=False).ids
    return head + [IDS["audio_pad"]] * n_audio + tail


def transcript(tok, ids):
    """What anna-transcribe prints: the text after <asr_text>, or all of it when absent, up to the
    first <|im_end|> / <|endoftext|>."""
    stop = [k for k, t in enumerate(ids) if t in (IDS["im_end"], IDS["endoftext"])]
    text = tok.decode(ids[:stop[0]] if stop else ids, skip_special_tokens=False)
    return text.split("<asr_text>", 1)[1] if "<asr_text>" in text else text


def main():
    import qwen_asr
    import transformers
    from qwen_asr.core.transformers_backend.configuration_qwen3_asr import Qwen3ASRConfig
    from qwen_asr.core.transformers_backend.modeling_qwen3_asr import Qwen3ASRForConditionalGeneration
    from safetensors.torch import save_file

    torch.set_grad_enabled(False)
    os.makedirs(OUT, exist_ok=True)
    tok = write_tokenizer()
    # qwen-asr's encoder builds cu_seqlens (the n_window_infer windows) but only the flash-attention
    # path uses them: with eager / sdpa no mask is passed and attention spans the whole clip. The
    # vLLM path (the package's other backend) and MODELS.md attend block-diagonally; clips under
    # n_window_infer (8 s released) are the same either way. The fixture's windows are 1 s, so the
    # reference is run with the block-diagonal mask its own _prepare_attention_mask builds.
    from qwen_asr.core.transformers_backend import modeling_qwen3_asr as mq
    layer_fwd = mq.Qwen3ASRAudioEncoderLayer.forward

    def windowed(self, hidden_states, cu_seqlens, attention_mask=None, **kw):
        if attention_mask is None:
            n = hidden_states.shape[0]
            attention_mask = torch.full([1, 1, n, n], torch.finfo(hidden_states.dtype).min)
            for i in range(1, len(cu_seqlens)):
                attention_mask[..., cu_seqlens[i - 1]:cu_seqlens[i], cu_seqlens[i - 1]:cu_seqlens[i]] = 0
        return layer_fwd(self, hidden_states, cu_seqlens, attention_mask, **kw)

    if os.environ.get("ASR_FULL_ATTENTION") != "1":
        mq.Qwen3ASRAudioEncoderLayer.forward = windowed
    cfg = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
           "support_languages": ["English", "Chinese"],
           "thinker_config": {"model_type": "qwen3_asr_thinker", "audio_config": AUDIO_CFG, "text_config": TEXT_CFG,
                              "audio_token_id": IDS["audio_pad"], "audio_start_token_id": IDS["audio_start"],
                              "audio_end_token_id": IDS["audio_end"],
                              "initializer_range": 0.02}}
    config = Qwen3ASRConfig(**{k: v for k, v in cfg.items() if k != "model_type" and k != "architectures"})
    config.thinker_config.audio_config._attn_implementation = "eager"
    config.thinker_config.text_config._attn_implementation = "eager"
    config.thinker_config._attn_implementation = "eager"
    model = Qwen3ASRForConditionalGeneration(config).eval().float()
    th = model.thinker
    g = torch.Generator().manual_seed(25)
    sd = model.state_dict()
    for name, t in sd.items():
        if name == "thinker.lm_head.weight":
            continue
        if "norm" in name and name.endswith("weight"):
            t.copy_(1 + 0.1 * torch.randn(t.shape, generator=g))
        elif name.endswith("bias"):
            t.copy_(0.1 * torch.randn(t.shape, generator=g))
        elif "embed_tokens" in name:
            t.copy_(EMB_STD * torch.randn(t.shape, generator=g))
        else:
            fan_in = t[0].numel()
            t.copy_(LIN_GAIN * torch.randn(t.shape, generator=g) / np.sqrt(fan_in))
    th.lm_head.weight = th.model.embed_tokens.weight  # tied, as the released checkpoints
    save = {k: v.contiguous().clone() for k, v in model.state_dict().items() if k != "thinker.lm_head.weight"}
    save_file(save, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
        f.write("\n")

    cases = []
    for clip in CLIPS:
        mel = np.fromfile(os.path.join(AUDIO, clip + ".mel.f32"), dtype="<f4").reshape(128, -1)
        L = mel.shape[1]
        feats = torch.from_numpy(mel.copy())
        enc = th.audio_tower(feats, feature_lens=torch.tensor([L])).last_hidden_state
        N = enc.shape[0]
        enc.numpy().astype("<f4").tofile(os.path.join(OUT, clip + ".enc.f32"))
        ids = prompt_ids(tok, N)
        inp = torch.tensor([ids])
        fam = torch.ones(1, L, dtype=torch.long)
        out = th(input_ids=inp, attention_mask=torch.ones_like(inp), input_features=feats[None],
                 feature_attention_mask=fam)
        logits = out.logits[0]
        logits.numpy().astype("<f4").tofile(os.path.join(OUT, clip + ".logits.f32"))
        seq, greedy = list(ids), []
        for _ in range(N_GEN):
            s = torch.tensor([seq])
            lg = th(input_ids=s, attention_mask=torch.ones_like(s), input_features=feats[None],
                    feature_attention_mask=fam).logits[0, -1]
            nxt = int(torch.argmax(lg))
            greedy.append(nxt)
            seq.append(nxt)
        text = transcript(tok, greedy)
        stop = [k for k, t in enumerate(greedy) if t in (IDS["im_end"], IDS["endoftext"])]
        gen = greedy[:stop[0] + 1] if stop else greedy
        # anna-transcribe --print-ids --max-new N_GEN FILE: the generated ids (through the stop id),
        # then the transcript
        with open(os.path.join(OUT, clip + ".cli.txt"), "w") as f:
            f.write(",".join(str(t) for t in gen) + "\n" + text + "\n")
        cases.append(dict(name=clip, mel=clip + ".mel.f32", file=FILES[clip], frames=L, tokens=N, prompt_ids=ids,
                          greedy_ids=greedy, transcript=text,
                          max_abs_enc=float(enc.abs().max()), max_abs_logit=float(logits.abs().max())))
        print(f"{clip}: L={L} N={N} prompt {len(ids)} greedy {greedy} |enc|max {enc.abs().max():.3g}")
    meta = dict(ids=IDS, prompt=PROMPT_HEAD + "<|audio_pad|>*N" + PROMPT_TAIL, n_gen=N_GEN, cases=cases,
                reference=dict(qwen_asr=getattr(qwen_asr, "__version__", "0.0.6"),
                               transformers=transformers.__version__, torch=torch.__version__))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


SHAPES = {  # MODELS.md "Qwen3-ASR": encoder d / layers / heads / ffn, output (text hidden)
    "0.6b": (896, 18, 14, 3584, 1024),
    "1.7b": (1024, 24, 16, 4096, 2048),
}


def bench_shape(name, out, frames=1200, threads=2):
    """A released-shape audio tower (seeded random bf16 weights, thinker.audio_tower.* only) and
    qwen-asr's windowed rows for `frames` mel frames tiled from the fixture clips (12 s by default:
    two 104-row windows), with its median wall time of 3 calls at torch.set_num_threads(threads).
    `test_asr --bench OUT` times anna on the same input and checks the rows."""
    import time
    import transformers
    from qwen_asr.core.transformers_backend import modeling_qwen3_asr as mq
    from qwen_asr.core.transformers_backend.configuration_qwen3_asr import Qwen3ASRAudioEncoderConfig
    from safetensors.torch import save_file
    torch.set_grad_enabled(False)
    d, layers, heads, ffn, outd = SHAPES[name]
    ac = dict(AUDIO_CFG, encoder_layers=layers, encoder_attention_heads=heads, encoder_ffn_dim=ffn, d_model=d,
              n_window_infer=800, downsample_hidden_size=480, output_dim=outd)
    os.makedirs(out, exist_ok=True)
    cfg = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
           "thinker_config": {"audio_config": ac, "text_config": dict(TEXT_CFG, hidden_size=outd)}}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    conf = Qwen3ASRAudioEncoderConfig(**ac)
    conf._attn_implementation = "eager"
    enc = mq.Qwen3ASRAudioEncoder(conf).eval()
    g = torch.Generator().manual_seed(7)
    for n, t in enc.state_dict().items():
        if "norm" in n and n.endswith("weight") or n.startswith("ln_post.weight"):
            t.copy_(1 + 0.1 * torch.randn(t.shape, generator=g))
        elif n.endswith("bias"):
            t.copy_(0.1 * torch.randn(t.shape, generator=g))
        else:
            t.copy_(torch.randn(t.shape, generator=g) / np.sqrt(t[0].numel()))
    # bf16 on disk (as released); the reference runs f32 on the same bf16-rounded values
    sd = {k: v.to(torch.bfloat16) for k, v in enc.state_dict().items()}
    enc.load_state_dict({k: v.float() for k, v in sd.items()})
    save_file({"thinker.audio_tower." + k: v.contiguous() for k, v in sd.items()}, os.path.join(out, "model.safetensors"))
    mels = [np.fromfile(os.path.join(AUDIO, c + ".mel.f32"), dtype="<f4").reshape(128, -1) for c in CLIPS]
    mel = np.concatenate(mels * (frames // sum(m.shape[1] for m in mels) + 1), axis=1)[:, :frames].copy()
    layer_fwd = mq.Qwen3ASRAudioEncoderLayer.forward

    def windowed(self, hidden_states, cu_seqlens, attention_mask=None, **kw):
        n = hidden_states.shape[0]
        attention_mask = torch.full([1, 1, n, n], torch.finfo(hidden_states.dtype).min)
        for i in range(1, len(cu_seqlens)):
            attention_mask[..., cu_seqlens[i - 1]:cu_seqlens[i], cu_seqlens[i - 1]:cu_seqlens[i]] = 0
        return layer_fwd(self, hidden_states, cu_seqlens, attention_mask, **kw)

    mq.Qwen3ASRAudioEncoderLayer.forward = windowed
    torch.set_num_threads(threads)
    x = torch.from_numpy(mel)
    rows = enc(x, feature_lens=torch.tensor([frames])).last_hidden_state
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        enc(x, feature_lens=torch.tensor([frames]))
        ts.append(time.perf_counter() - t0)
    mel.astype("<f4").tofile(os.path.join(out, "bench.mel.f32"))
    rows.numpy().astype("<f4").tofile(os.path.join(out, "bench.enc.f32"))
    info = dict(shape=name, frames=frames, rows=int(rows.shape[0]), out_dim=outd, threads=threads,
                reference_s=sorted(ts)[1], max_abs=float(rows.abs().max()), torch=torch.__version__,
                transformers=transformers.__version__)
    json.dump(info, open(os.path.join(out, "bench.json"), "w"), indent=1)
    print(json.dumps(info))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--shape":
        a = sys.argv[2:]
        bench_shape(a[0], a[1], *(int(v) for v in a[2:4]))
    else:
        main()
