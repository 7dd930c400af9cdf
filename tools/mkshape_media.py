#!/usr/bin/env python3
"""Write random-weight media model folders with the released tensor shapes (issues 24-26 benchmarks).

    python3 tools/mkshape_media.py asr-0.6b OUT          # Qwen3-ASR 0.6B (thinker.*), tokenizer
    python3 tools/mkshape_media.py tts-0.6b OUT          # Qwen3-TTS 12 Hz 0.6B CustomVoice + speech_tokenizer/
    python3 tools/mkshape_media.py vision-9b OUT [--text-layers N]
                                                         # Qwen3.5-9B vision tower + a 9B-wide text model
    ... --tiny                                           # the same code path with shrunk dims (CPU checks)
    python3 tools/mkshape_media.py --check-fixtures      # names and shapes vs the repo's fixtures

Only numpy (tools/mkshape.py's writer: bf16 safetensors written row block by row block, one
seeded generator per tensor, so a folder is the same bytes on every machine).

Shapes (../shared/docs/MODELS.md):
  asr-0.6b   audio encoder d 896, 18 layers, 14 heads, ffn 3584, conv hidden 480, n_window 50 /
             n_window_infer 800, output 1024; text Qwen3 1024 / 3072 / 28 layers / 16,8 heads of
             128, vocab 151936, tied. Ids: the shared 1000-id test tokenizer, filler pieces
             "<fillN>" up to the vocabulary (so every id the random model emits decodes, in anna
             and in HF tokenizers alike), then <|audio_start|> <|audio_end|> <|audio_pad|>
             <asr_text> as its last 4 ids (151932-151935; thinker_config carries them). The
             specials must follow the BPE vocabulary without a gap: HF tokenizers numbers added
             tokens after it whatever tokenizer.json says (with a gap the reference never saw
             the audio pads).
  tts-0.6b   talker Qwen3 1024 / 3072 / 28 / 16,8 / 128, text embedding 151936 x 2048, codec
             vocab 3072 (released control ids), code predictor 1024 / 3072 / 5 / 16,8 / 128 over
             2048-entry codebooks (no small_to_mtp_projection: equal widths, the 0.6B layout);
             speech_tokenizer/ = the released 12 Hz decoder config (codebook_dim 512, latent
             1024, hidden 512, 16 heads x 64, I 1024, 8 layers, window 72, decoder_dim 1536,
             upsample [8,5,4,3] x [2,2]). Text ids come from the shared test tokenizer
             (im_start 1 / im_end 2 in config.json; tts_pad/bos/eos keep 151671-151673) with
             "assistant" merged into one token (id 1001), as the talker's prompt check needs.
  vision-9b  tower depth 27, hidden 1152, 16 heads, I 4304, out 4096 (the 9B row of MODELS.md)
             on the Qwen3.5-9B text shape truncated to --text-layers (default 4: 3 GDN + 1 full
             attention; 32 = the whole 9B, ~19 GB); image/vision ids 9/7/8 of the test tokenizer,
             the vision e2e chat template, the released preprocessor sizes.
Weights: matrices normal(0, 1/sqrt(fan_in)) for the encoders / codec (activations stay O(1)
through deep random stacks), normal(0, 0.02) for the language models (as mkshape.py), norms
1 + normal(0, 0.02), biases normal(0, 0.02); codec layer scales 0.1, ConvNeXt gammas 0.1,
SnakeBeta log-alpha/beta 0, codebook usage uniform(0.5, 2). Stored as the fixtures store them:
ASR / TTS talker matrices bf16 and 1-D f32; codec f32 with bf16 codebook sums; vision bf16.
"""
import argparse
import json
import math
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import mkshape  # noqa: E402
from mkshape import CONST, NORMAL, UNIFORM, Tensor  # noqa: E402

ROOT = os.path.dirname(HERE)
# the shared test tokenizer; on a machine without ../shared (a device call), a copy carried under
# .gpu/fx/tokenizer, or ANNA_FIXTURE_TOKENIZER
TOKENIZER = os.environ.get("ANNA_FIXTURE_TOKENIZER") or next(
    (d for d in (mkshape.FIXTURE_TOKENIZER, os.path.join(ROOT, "..", "shared", "fixtures", "tokenizer"),
                 os.path.join(ROOT, ".gpu", "fx", "tokenizer")) if os.path.isfile(os.path.join(d, "tokenizer.json"))),
    mkshape.FIXTURE_TOKENIZER)
LM_STD = 0.02


def W(name, *shape, dtype="BF16", std=None):
    """A matrix (conv kernels included): fan-in = product of all but the first dim."""
    fan_in = int(math.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
    return Tensor(name, shape, (NORMAL, 0.0, std if std is not None else 1.0 / math.sqrt(max(fan_in, 1))), dtype=dtype)


def B(name, n, dtype="F32"):
    return Tensor(name, (n,), (NORMAL, 0.0, 0.02), dtype=dtype)


def N(name, n, dtype="F32"):
    return Tensor(name, (n,), (NORMAL, 1.0, 0.02), dtype=dtype)


def C(name, n, v, dtype="F32"):
    return Tensor(name, (n,), (CONST, v, 0), dtype=dtype)


def qwen3_layers(pre, L, H, I, heads, kv, hd, mdt="BF16", vdt="F32"):
    """A Qwen3 decoder's layers (q/k norm, GQA, SwiGLU, no biases) as HF names them."""
    ts = []
    for i in range(L):
        p = f"{pre}layers.{i}."
        ts += [N(p + "input_layernorm.weight", H, vdt),
               W(p + "self_attn.q_proj.weight", heads * hd, H, dtype=mdt, std=LM_STD),
               W(p + "self_attn.k_proj.weight", kv * hd, H, dtype=mdt, std=LM_STD),
               W(p + "self_attn.v_proj.weight", kv * hd, H, dtype=mdt, std=LM_STD),
               W(p + "self_attn.o_proj.weight", H, heads * hd, dtype=mdt, std=LM_STD),
               N(p + "self_attn.q_norm.weight", hd, vdt), N(p + "self_attn.k_norm.weight", hd, vdt),
               W(p + "mlp.gate_proj.weight", I, H, dtype=mdt, std=LM_STD),
               W(p + "mlp.up_proj.weight", I, H, dtype=mdt, std=LM_STD),
               W(p + "mlp.down_proj.weight", H, I, dtype=mdt, std=LM_STD),
               N(p + "post_attention_layernorm.weight", H, vdt)]
    return ts


# ----------------------------------------------------------------------------- ASR

def asr_ids(vocab):
    """The audio specials sit at the vocabulary's last 4 ids, after the filler pieces: HF tokenizers
    gives an added token the next id after the BPE vocabulary whatever tokenizer.json says, so the
    ids must follow the vocabulary without a gap (as in Qwen's own tokenizer.json)."""
    a = vocab - len(ASR_SPECIALS)
    return dict(endoftext=0, im_start=1, im_end=2, audio_start=a, audio_end=a + 1, audio_pad=a + 2, asr_text=a + 3)
ASR_SPECIALS = ("<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<asr_text>")
ASR = {  # encoder d / layers / heads / ffn / conv hidden; text hidden / I / layers / heads / kv / head_dim / vocab
    "real": dict(d=896, el=18, eh=14, effn=3584, ch=480, H=1024, I=3072, L=28, heads=16, kv=8, hd=128, vocab=151936,
                 n_window=50, n_window_infer=800),
    # tiny: the fixture's dims (tests/fixtures/qwen3_asr) but the released 8-s attention window, vocab
    # kept past the tokenizer so the filler path runs
    "tiny": dict(d=64, el=2, eh=2, effn=128, ch=16, H=48, I=96, L=2, heads=4, kv=2, hd=16, vocab=1200,
                 n_window=50, n_window_infer=800),
}


def asr_tensors(s):
    d, ch = s["d"], s["ch"]
    a = "thinker.audio_tower."
    ts = [W(a + "conv2d1.weight", ch, 1, 3, 3), B(a + "conv2d1.bias", ch),
          W(a + "conv2d2.weight", ch, ch, 3, 3), B(a + "conv2d2.bias", ch),
          W(a + "conv2d3.weight", ch, ch, 3, 3), B(a + "conv2d3.bias", ch),
          W(a + "conv_out.weight", d, ch * 16)]  # 128 mels / 2^3 = 16 frequency rows
    for i in range(s["el"]):
        p = f"{a}layers.{i}."
        ts += [W(p + "fc1.weight", s["effn"], d), B(p + "fc1.bias", s["effn"]),
               W(p + "fc2.weight", d, s["effn"]), B(p + "fc2.bias", d),
               N(p + "final_layer_norm.weight", d), B(p + "final_layer_norm.bias", d)]
        for q in ("k_proj", "out_proj", "q_proj", "v_proj"):
            ts += [W(p + f"self_attn.{q}.weight", d, d), B(p + f"self_attn.{q}.bias", d)]
        ts += [N(p + "self_attn_layer_norm.weight", d), B(p + "self_attn_layer_norm.bias", d)]
    ts += [N(a + "ln_post.weight", d), B(a + "ln_post.bias", d),
           W(a + "proj1.weight", d, d), B(a + "proj1.bias", d),
           W(a + "proj2.weight", s["H"], d), B(a + "proj2.bias", s["H"])]
    m = "thinker.model."
    ts.append(Tensor(m + "embed_tokens.weight", (s["vocab"], s["H"]), (NORMAL, 0.0, LM_STD), dtype="BF16"))
    ts += qwen3_layers(m, s["L"], s["H"], s["I"], s["heads"], s["kv"], s["hd"])
    # a final norm well above 1 (as trained Qwen models): peaked logits from the tied head
    ts.append(Tensor(m + "norm.weight", (s["H"],), (NORMAL, 3.0, 0.1), dtype="F32"))
    return ts


def asr_config(s):
    ids = asr_ids(s["vocab"])
    audio = dict(num_mel_bins=128, encoder_layers=s["el"], encoder_attention_heads=s["eh"], encoder_ffn_dim=s["effn"],
                 d_model=s["d"], n_window=s["n_window"], n_window_infer=s["n_window_infer"],
                 downsample_hidden_size=s["ch"], output_dim=s["H"], max_source_positions=1500,
                 activation_function="gelu", conv_chunksize=500, dropout=0, attention_dropout=0,
                 activation_dropout=0, scale_embedding=False)
    text = dict(model_type="qwen3_asr_text", vocab_size=s["vocab"], hidden_size=s["H"], intermediate_size=s["I"],
                num_hidden_layers=s["L"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                head_dim=s["hd"], hidden_act="silu", max_position_embeddings=65536, rms_norm_eps=1e-6,
                rope_theta=1000000.0,
                rope_scaling={"interleaved": True, "mrope_interleaved": True, "mrope_section": [24, 20, 20],
                              "rope_type": "default", "type": "default"},
                attention_bias=False, tie_word_embeddings=True, use_cache=True)
    if s["hd"] != 128:
        text["rope_scaling"]["mrope_section"] = [s["hd"] // 4, s["hd"] // 8, s["hd"] // 8]
    return {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
            "support_languages": ["English", "Chinese"],
            "thinker_config": {"model_type": "qwen3_asr_thinker", "audio_config": audio, "text_config": text,
                               "audio_token_id": ids["audio_pad"], "audio_start_token_id": ids["audio_start"],
                               "audio_end_token_id": ids["audio_end"], "initializer_range": 0.02}}


def write_tokenizer_filled(out, specials, vocab):
    """The shared test tokenizer + unreachable filler pieces up to `vocab` - len(specials) ids
    (printable ASCII: byte-level decoding maps them to themselves), then the added specials."""
    tj = json.load(open(os.path.join(TOKENIZER, "tokenizer.json")))
    for k, piece in enumerate(specials):
        tj["added_tokens"].append(dict(id=vocab - len(specials) + k, content=piece, single_word=False, lstrip=False,
                                       rstrip=False, normalized=False, special=True))
    v = tj["model"]["vocab"]
    first = len(v)
    assert first == 1000 and all(t["id"] < first for t in tj["added_tokens"][:-len(specials)])
    for i in range(first, vocab - len(specials)):
        v[f"<fill{i}>"] = i
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    shutil.copy(os.path.join(TOKENIZER, "tokenizer_config.json"), os.path.join(out, "tokenizer_config.json"))


# ----------------------------------------------------------------------------- TTS

def write_tokenizer_tts(out):
    """The shared test tokenizer with "assistant" made one token (ids 1000 "assist", 1001
    "assistant", two merges ranked last): the talker's prompt check wants
    <|im_start|> assistant \\n as three ids, as Qwen's tokenizer gives them."""
    tj = json.load(open(os.path.join(TOKENIZER, "tokenizer.json")))
    v, m = tj["model"]["vocab"], tj["model"]["merges"]
    assert "assist" not in v and "assistant" not in v
    v["assist"], v["assistant"] = 1000, 1001
    m += [["ass", "ist"], ["assist", "ant"]]
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tj, f, ensure_ascii=False)
    for fn in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(TOKENIZER, fn), os.path.join(out, fn))


TTS = {
    "real": dict(H=1024, I=3072, L=28, heads=16, kv=8, hd=128, th=2048, tv=151936,
                 pH=1024, pI=3072, pL=5, pheads=16, pkv=8, phd=128, pv=2048,
                 c=dict(cbdim=512, latent=1024, hidden=512, heads=16, kv=16, hd=64, I=1024, L=8, window=72, ddim=1536)),
    "tiny": dict(H=16, I=40, L=2, heads=4, kv=2, hd=8, th=4, tv=151936,
                 pH=12, pI=28, pL=2, pheads=2, pkv=1, phd=8, pv=256,
                 c=dict(cbdim=8, latent=24, hidden=16, heads=4, kv=2, hd=6, I=20, L=3, window=6, ddim=32)),
}
TTS_SPEAKERS = {"vivian": 3000, "ryan": 3001, "eric": 3002}
TTS_DIALECT = {"vivian": False, "ryan": False, "eric": "sichuan_dialect"}
TTS_LANGS = {"english": 2050, "chinese": 2055, "sichuan_dialect": 2062}
UPSAMPLE_RATES, UPSAMPLING_RATIOS = [8, 5, 4, 3], [2, 2]


def tts_tensors(s):
    H, pH = s["H"], s["pH"]
    t = "talker."
    ts = [W(t + "model.text_embedding.weight", s["tv"], s["th"], std=1.0),
          W(t + "text_projection.linear_fc1.weight", s["th"], s["th"]), B(t + "text_projection.linear_fc1.bias", s["th"]),
          W(t + "text_projection.linear_fc2.weight", H, s["th"]), B(t + "text_projection.linear_fc2.bias", H),
          W(t + "model.codec_embedding.weight", 3072, H, std=1.0),
          W(t + "codec_head.weight", 3072, H)]
    ts += qwen3_layers(t + "model.", s["L"], H, s["I"], s["heads"], s["kv"], s["hd"])
    ts.append(N(t + "model.norm.weight", H))
    cp = t + "code_predictor."
    ts += qwen3_layers(cp + "model.", s["pL"], pH, s["pI"], s["pheads"], s["pkv"], s["phd"])
    ts.append(N(cp + "model.norm.weight", pH))
    for k in range(15):
        ts += [W(cp + f"model.codec_embedding.{k}.weight", s["pv"], H, std=1.0),
               W(cp + f"lm_head.{k}.weight", s["pv"], pH)]
    if pH != H:
        ts += [W(cp + "small_to_mtp_projection.weight", pH, H), B(cp + "small_to_mtp_projection.bias", pH)]
    return ts


def tts_config(s):
    talker = {
        "vocab_size": 3072, "hidden_size": s["H"], "intermediate_size": s["I"], "num_hidden_layers": s["L"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv"], "head_dim": s["hd"], "hidden_act": "silu",
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
        "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20] if s["hd"] == 128 else [2, 1, 1],
                         "rope_type": "default", "type": "default"},
        "attention_bias": False, "use_sliding_window": False, "num_code_groups": 16,
        "text_hidden_size": s["th"], "text_vocab_size": s["tv"],
        "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149,
        "spk_id": TTS_SPEAKERS, "spk_is_dialect": TTS_DIALECT, "codec_language_id": TTS_LANGS,
        "code_predictor_config": {
            "vocab_size": s["pv"], "hidden_size": s["pH"], "intermediate_size": s["pI"],
            "num_hidden_layers": s["pL"], "num_attention_heads": s["pheads"], "num_key_value_heads": s["pkv"],
            "head_dim": s["phd"], "hidden_act": "silu", "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000, "attention_bias": False, "use_sliding_window": False, "num_code_groups": 16},
    }
    return {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
            "tts_model_type": "custom_voice", "tts_model_size": "0b6", "tokenizer_type": "qwen3_tts_tokenizer_12hz",
            "im_start_token_id": 1, "im_end_token_id": 2,  # the shared test tokenizer's <|im_start|> / <|im_end|>
            "tts_pad_token_id": 151671, "tts_bos_token_id": 151672, "tts_eos_token_id": 151673,
            "talker_config": talker, "speaker_encoder_config": {"enc_dim": s["H"], "sample_rate": 24000}}


def codec_tensors(c):
    cb, half, lat, hid = c["cbdim"], c["cbdim"] // 2, c["latent"], c["hidden"]
    d = "decoder."
    ts = []
    for q, n in (("rvq_first", 1), ("rvq_rest", 15)):
        p = f"{d}quantizer.{q}."
        ts += [W(p + "input_proj.weight", half, cb, 1, dtype="F32"), W(p + "output_proj.weight", cb, half, 1, dtype="F32")]
        for k in range(n):
            ts += [Tensor(p + f"vq.layers.{k}._codebook.cluster_usage", (2048,), (UNIFORM, 0.5, 2.0), dtype="F32"),
                   Tensor(p + f"vq.layers.{k}._codebook.embedding_sum", (2048, half), (NORMAL, 0.0, 1.0), dtype="BF16")]
    ts += [W(d + "pre_conv.conv.weight", lat, cb, 3, dtype="F32"), B(d + "pre_conv.conv.bias", lat)]
    t = d + "pre_transformer."
    ts += [W(t + "input_proj.weight", hid, lat, dtype="F32"), B(t + "input_proj.bias", hid)]
    for i in range(c["L"]):
        p = f"{t}layers.{i}."
        ts += [N(p + "input_layernorm.weight", hid),
               W(p + "self_attn.q_proj.weight", c["heads"] * c["hd"], hid, dtype="F32"),
               W(p + "self_attn.k_proj.weight", c["kv"] * c["hd"], hid, dtype="F32"),
               W(p + "self_attn.v_proj.weight", c["kv"] * c["hd"], hid, dtype="F32"),
               W(p + "self_attn.o_proj.weight", hid, c["heads"] * c["hd"], dtype="F32"),
               C(p + "self_attn_layer_scale.scale", hid, 0.1),
               N(p + "post_attention_layernorm.weight", hid),
               W(p + "mlp.gate_proj.weight", c["I"], hid, dtype="F32"),
               W(p + "mlp.up_proj.weight", c["I"], hid, dtype="F32"),
               W(p + "mlp.down_proj.weight", hid, c["I"], dtype="F32"),
               C(p + "mlp_layer_scale.scale", hid, 0.1)]
    ts += [N(t + "norm.weight", hid), W(t + "output_proj.weight", lat, hid, dtype="F32"), B(t + "output_proj.bias", lat)]
    for i, r in enumerate(UPSAMPLING_RATIOS):
        p = f"{d}upsample.{i}."
        ts += [W(p + "0.conv.weight", lat, lat, r, dtype="F32"), B(p + "0.conv.bias", lat),
               W(p + "1.dwconv.conv.weight", lat, 1, 7, dtype="F32"), B(p + "1.dwconv.conv.bias", lat),
               C(p + "1.gamma", lat, 0.1), N(p + "1.norm.weight", lat), B(p + "1.norm.bias", lat),
               W(p + "1.pwconv1.weight", 4 * lat, lat, dtype="F32"), B(p + "1.pwconv1.bias", 4 * lat),
               W(p + "1.pwconv2.weight", lat, 4 * lat, dtype="F32"), B(p + "1.pwconv2.bias", lat)]
    ch = c["ddim"]
    ts += [W(d + "decoder.0.conv.weight", ch, lat, 7, dtype="F32"), B(d + "decoder.0.conv.bias", ch)]
    for i, r in enumerate(UPSAMPLE_RATES):
        p = f"{d}decoder.{i + 1}.block."
        o = ch // 2
        ts += [C(p + "0.alpha", ch, 0.0), C(p + "0.beta", ch, 0.0),
               W(p + "1.conv.weight", ch, o, 2 * r, dtype="F32"), B(p + "1.conv.bias", o)]
        for u in (2, 3, 4):
            q = f"{p}{u}."
            ts += [C(q + "act1.alpha", o, 0.0), C(q + "act1.beta", o, 0.0),
                   C(q + "act2.alpha", o, 0.0), C(q + "act2.beta", o, 0.0),
                   W(q + "conv1.conv.weight", o, o, 7, dtype="F32"), B(q + "conv1.conv.bias", o),
                   W(q + "conv2.conv.weight", o, o, 1, dtype="F32"), B(q + "conv2.conv.bias", o)]
        ch = o
    ts += [C(d + "decoder.5.alpha", ch, 0.0), C(d + "decoder.5.beta", ch, 0.0),
           W(d + "decoder.6.conv.weight", 1, ch, 7, dtype="F32", std=0.3 / math.sqrt(ch * 7)),
           C(d + "decoder.6.conv.bias", 1, 0.0)]
    return ts


def codec_config(c):
    return {"architectures": ["Qwen3TTSTokenizerV2Model"], "model_type": "qwen3_tts_tokenizer_12hz",
            "encoder_valid_num_quantizers": 16, "input_sample_rate": 24000, "output_sample_rate": 24000,
            "decode_upsample_rate": 1920, "encode_downsample_rate": 1920,
            "decoder_config": {"codebook_size": 2048, "codebook_dim": c["cbdim"], "hidden_size": c["hidden"],
                               "latent_dim": c["latent"], "max_position_embeddings": 8000, "rope_theta": 10000,
                               "num_attention_heads": c["heads"], "num_key_value_heads": c["kv"], "head_dim": c["hd"],
                               "attention_bias": False, "sliding_window": c["window"], "intermediate_size": c["I"],
                               "hidden_act": "silu", "layer_scale_initial_scale": 0.01, "rms_norm_eps": 1e-5,
                               "num_hidden_layers": c["L"], "num_quantizers": 16, "upsample_rates": UPSAMPLE_RATES,
                               "upsampling_ratios": UPSAMPLING_RATIOS, "decoder_dim": c["ddim"],
                               "attention_dropout": 0.0}}


# ----------------------------------------------------------------------------- vision

VISION = {
    "real": dict(depth=27, hidden=1152, heads=16, I=4304, text="qwen3.5-9b", text_layers=4, vocab=0),
    "tiny": dict(depth=2, hidden=64, heads=2, I=128, text="tiny", text_layers=4, vocab=1000),
}
TINY_TEXT = dict(family="qwen3_5", hidden=128, inter=256, layers=4, heads=4, kv=2, gdn_hv=16, tied=True)
VISION_IDS = dict(image_token_id=9, video_token_id=10, vision_start_token_id=7, vision_end_token_id=8)


def vision_tensors(v, out_hidden):
    H, I = v["hidden"], v["I"]
    p = "model.visual."
    ts = [W(p + "patch_embed.proj.weight", H, 3, 2, 16, 16), B(p + "patch_embed.proj.bias", H, "BF16"),
          W(p + "pos_embed.weight", 2304, H, std=0.02)]
    for i in range(v["depth"]):
        b = f"{p}blocks.{i}."
        ts += [N(b + "norm1.weight", H, "BF16"), B(b + "norm1.bias", H, "BF16"),
               W(b + "attn.qkv.weight", 3 * H, H), B(b + "attn.qkv.bias", 3 * H, "BF16"),
               W(b + "attn.proj.weight", H, H), B(b + "attn.proj.bias", H, "BF16"),
               N(b + "norm2.weight", H, "BF16"), B(b + "norm2.bias", H, "BF16"),
               W(b + "mlp.linear_fc1.weight", I, H), B(b + "mlp.linear_fc1.bias", I, "BF16"),
               W(b + "mlp.linear_fc2.weight", H, I), B(b + "mlp.linear_fc2.bias", H, "BF16")]
    ts += [N(p + "merger.norm.weight", H, "BF16"), B(p + "merger.norm.bias", H, "BF16"),
           W(p + "merger.linear_fc1.weight", 4 * H, 4 * H), B(p + "merger.linear_fc1.bias", 4 * H, "BF16"),
           W(p + "merger.linear_fc2.weight", out_hidden, 4 * H), B(p + "merger.linear_fc2.bias", out_hidden, "BF16")]
    return ts


def vision_build(v, text_layers):
    s = TINY_TEXT if v["text"] == "tiny" else mkshape.SHAPES[v["text"]]
    vocab = v["vocab"] or mkshape.QWEN35_COMMON["vocab"]
    ts = mkshape.qwen35_tensors(s, text_layers, vocab, False)
    cfg = mkshape.qwen35_config(s, text_layers, vocab)
    cfg["text_config"]["eos_token_id"] = 2
    cfg.update(VISION_IDS)
    cfg["vision_config"] = {"depth": v["depth"], "hidden_act": "gelu_pytorch_tanh", "hidden_size": v["hidden"],
                            "in_channels": 3, "initializer_range": 0.02, "intermediate_size": v["I"],
                            "model_type": "qwen3_5_vision", "num_heads": v["heads"], "num_position_embeddings": 2304,
                            "out_hidden_size": s["hidden"], "patch_size": 16,
                            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"},
                            "spatial_merge_size": 2, "temporal_patch_size": 2, "deepstack_visual_indexes": []}
    return vision_tensors(v, s["hidden"]) + ts, cfg


PREPROCESSOR = {"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "patch_size": 16, "temporal_patch_size": 2,
                "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
                "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
                "rescale_factor": 1 / 255, "image_processor_type": "Qwen2VLImageProcessor"}


# ----------------------------------------------------------------------------- main

def build(kind, size, text_layers=None):
    """(tensors, config, extra) for a model kind; extra: {"codec": (tensors, config)} for TTS."""
    if kind == "asr":
        s = ASR[size]
        return asr_tensors(s), asr_config(s), {"vocab": s["vocab"]}
    if kind == "tts":
        s = TTS[size]
        return tts_tensors(s), tts_config(s), {"codec": (codec_tensors(s["c"]), codec_config(s["c"]))}
    v = VISION[size]
    ts, cfg = vision_build(v, text_layers or v["text_layers"])
    return ts, cfg, {}


def write(kind, out, size, seed, text_layers=None, chunk_mb=64):
    ts, cfg, extra = build(kind, size, text_layers)
    os.makedirs(out, exist_ok=True)
    if os.listdir(out):
        raise SystemExit(f"error: {out} exists and is not empty")
    chunk = chunk_mb * (1 << 20) // 4
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    nb = sum(t.nbytes for t in ts)
    print(f"[mkshape_media] {kind} ({size}): {len(ts)} tensors, {sum(t.numel for t in ts) / 1e9:.3f} B params, "
          f"{nb / 1e9:.2f} GB", file=sys.stderr)
    if kind == "asr":
        write_tokenizer_filled(out, ASR_SPECIALS, extra["vocab"])
        mkshape.write_model(out, ts, seed, 1 << 62, chunk)
    elif kind == "tts":
        write_tokenizer_tts(out)
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump({"do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
                       "subtalker_dosample": True, "subtalker_top_k": 50, "subtalker_top_p": 1.0,
                       "subtalker_temperature": 0.9, "max_new_tokens": 8192}, f, indent=1)
        mkshape.write_model(out, ts, seed, 1 << 62, chunk)
        cts, ccfg = extra["codec"]
        cdir = os.path.join(out, "speech_tokenizer")
        os.makedirs(cdir, exist_ok=True)
        with open(os.path.join(cdir, "config.json"), "w") as f:
            json.dump(ccfg, f, indent=1)
        mkshape.write_model(cdir, cts, seed + 1, 1 << 62, chunk)
    else:
        mkshape.copy_tokenizer(out, TOKENIZER)
        shutil.copy(os.path.join(ROOT, "tests", "fixtures", "qwen3_5_vision", "e2e", "chat_template.jinja"),
                    os.path.join(out, "chat_template.jinja"))
        with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
            json.dump(PREPROCESSOR, f, indent=1)
        with open(os.path.join(out, "generation_config.json"), "w") as f:
            json.dump({"do_sample": False, "eos_token_id": 2}, f)
        mkshape.write_model(out, ts, seed, int(5e9), chunk)
    with open(os.path.join(out, "MKSHAPE.json"), "w") as f:
        json.dump({"kind": kind, "size": size, "seed": seed, "text_layers": text_layers, "bytes": nb,
                   "command": " ".join(sys.argv)}, f, indent=1)


def st_shapes(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    return {k: tuple(v["shape"]) for k, v in h.items() if k != "__metadata__"}


def check_fixtures():
    """The tiny builds must name and shape every tensor as the reference-written fixtures do."""
    fx = os.path.join(ROOT, "tests", "fixtures")
    bad = 0
    cases = [("asr", asr_tensors(dict(ASR["tiny"], vocab=1004)), os.path.join(fx, "qwen3_asr", "model.safetensors")),
             ("tts", tts_tensors(TTS["tiny"]), os.path.join(fx, "qwen3_tts", "model.safetensors")),
             ("codec", codec_tensors(TTS["tiny"]["c"]), os.path.join(fx, "qwen3_tts_codec", "model.safetensors")),
             ("vision", vision_tensors(VISION["tiny"], 128),
              os.path.join(os.path.dirname(ROOT), "shared", "fixtures", "qwen3_5", "model.safetensors"))]
    for name, ts, path in cases:
        want = st_shapes(path)
        if name == "vision":
            want = {k: v for k, v in want.items() if k.startswith("model.visual.")}
        have = {t.name: t.shape for t in ts}
        miss, extra = sorted(set(want) - set(have)), sorted(set(have) - set(want))
        diff = sorted(k for k in set(want) & set(have) if want[k] != have[k])
        ok = not (miss or extra or diff)
        bad += not ok
        print(f"{name:7s} {'OK  ' if ok else 'FAIL'} {len(have)} tensors vs {path}"
              + (f"\n  missing {miss[:5]}\n  extra {extra[:5]}\n  shape {[(k, want[k], have[k]) for k in diff[:5]]}"
                 if not ok else ""))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", nargs="?", choices=["asr-0.6b", "tts-0.6b", "vision-9b"])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--tiny", action="store_true", help="shrunk dims, same code path")
    ap.add_argument("--text-layers", type=int, default=0, help="vision-9b: text layers (default 4; 32 = full 9B)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-fixtures", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="print tensors and config, write nothing")
    a = ap.parse_args()
    if a.check_fixtures:
        return check_fixtures()
    if not a.shape:
        ap.error("a shape is needed")
    kind = a.shape.split("-")[0]
    size = "tiny" if a.tiny else "real"
    if a.dry_run:
        ts, cfg, extra = build(kind, size, a.text_layers)
        for t in ts + (extra["codec"][0] if "codec" in extra else []):
            print(t.name, t.dtype, list(t.shape))
        print(json.dumps(cfg, indent=1))
        print(f"{sum(t.numel for t in ts) / 1e9:.3f} B params", file=sys.stderr)
        return 0
    if not a.out:
        ap.error("an output folder is needed")
    write(kind, a.out, size, a.seed, a.text_layers or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
