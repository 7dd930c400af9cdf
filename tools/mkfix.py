# Builds tiny random-weight reference models with HF transformers, plus a tiny
# byte-level BPE tokenizer, and records reference outputs for a C implementation.
import os, sys, json, glob, struct, traceback, io
import numpy as np, torch
import transformers
from tokenizers import Tokenizer, models, trainers, pre_tokenizers, decoders, normalizers, Regex
OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)
torch.set_grad_enabled(False)
log = open(os.path.join(OUT, "generate.log"), "w")
def P(*a):
    s = " ".join(str(x) for x in a); print(s); log.write(s + "\n"); log.flush()
P("transformers", transformers.__version__, "torch", torch.__version__)

# ---------- tokenizer ----------
QWEN_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
corpus = []
for f in sorted(glob.glob(os.path.dirname(transformers.__file__) + "/**/*.py", recursive=True))[:400]:
    try: corpus.append(open(f, encoding="utf-8").read())
    except Exception: pass
extra = ["你好，世界！今天天气很好。", "안녕하세요 세계", "こんにちは世界", "Ünïcödé façade naïve café", "emoji 😀🚀👍🏽 mix",
         "Numbers 1234567890 3.14159 1e-9", "tabs\tand\nnewlines\r\n  spaces   ", "def f(x):\n    return x**2\n"] * 50
corpus += extra
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
            "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
tok = Tokenizer(models.BPE())
tok.normalizer = normalizers.NFC()
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(QWEN_PAT), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
tok.train_from_iterator(corpus, trainer)
VOCAB = tok.get_vocab_size()
P("tokenizer vocab", VOCAB)
tokdir = os.path.join(OUT, "tokenizer")
os.makedirs(tokdir, exist_ok=True)
tok.save(os.path.join(tokdir, "tokenizer.json"))
# chat template: a Qwen-style ChatML template with thinking switch and tools, small but real Jinja
CHAT_TEMPLATE = open(os.path.join(os.path.dirname(__file__), "chat_template.jinja")).read()
from transformers import PreTrainedTokenizerFast
hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None)
hf_tok.chat_template = CHAT_TEMPLATE
hf_tok.save_pretrained(tokdir)
tests = ["Hello world", "Hello  world!!  ", "I'm here, you're there; they'll go.", "你好，世界！", "안녕하세요", "😀🚀👍🏽",
         "café naïve façade", "e\u0301 composed?", "line1\nline2\r\n\n\tindent", "   leading spaces", "trailing   ",
         "x = 12345678 + 3.14", "<|im_start|>user\nhi<|im_end|>", "def f(x):\n    return x**2\n", "", " ", "\n\n\n",
         "ALLCAPS Mixed CaSe", "don'T DON'T", "a\u00a0b\u2003c", "\x00\x01 control", "tab\there", "🏳️‍🌈 zwj"]
enc = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in tests]
for e in enc: e["decoded"] = tok.decode(e["ids"], skip_special_tokens=False)
msgs_cases = [
  {"messages": [{"role": "user", "content": "Hi there"}], "add_generation_prompt": True},
  {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}], "add_generation_prompt": True},
  {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": True, "enable_thinking": False},
  {"messages": [{"role": "user", "content": "Weather in Paris?"}], "add_generation_prompt": True,
   "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Get weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]},
  {"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "{\"temp\": 21}"}], "add_generation_prompt": True},
]
chat = []
for c in msgs_cases:
    kw = {k: v for k, v in c.items() if k not in ("messages", "tools", "add_generation_prompt")}
    try:
        txt = hf_tok.apply_chat_template(c["messages"], tools=c.get("tools"), add_generation_prompt=c["add_generation_prompt"], tokenize=False, **kw)
        chat.append({**c, "rendered": txt})
    except Exception as ex:
        P("chat template error", ex); traceback.print_exc()
json.dump({"encode": enc, "chat": chat}, open(os.path.join(tokdir, "expected.json"), "w"), ensure_ascii=False, indent=1)

# ---------- models ----------
def save_f32(path, t):
    a = t.detach().float().contiguous().cpu().numpy().astype("<f4")
    a.tofile(path)
    return list(a.shape)

def make_prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(20, VOCAB, (1, n), generator=g)

def run_case(name, build, text_only_model_getter=None, n_short=23, n_long=150, gen=24, extra=None):
    if name in LONG: n_long = LONG[name]
    if name in EXTRA: extra = EXTRA[name]
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    try:
        model = build()
        model.eval()
        # bf16-round the weights (checkpoints are bf16), keep compute in fp32
        with torch.no_grad():
            for p in model.parameters(): p.copy_(p.to(torch.bfloat16).float())
        model.save_pretrained(d, safe_serialization=True)
        # store weights in bf16 like real checkpoints
        from safetensors.torch import load_file, save_file
        for f in glob.glob(os.path.join(d, "*.safetensors")):
            sd = load_file(f)
            save_file({k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}, f, metadata={"format": "pt"})
        hf_tok.save_pretrained(d)
        man = {"model": name, "class": type(model).__name__, "vocab": VOCAB, "cases": []}
        for tag, n, seed in (("short", n_short, 1), ("long", n_long, 2)):
            ids = make_prompt(n, seed)
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            lg = out.logits[0]
            case = {"tag": tag, "prompt_ids": ids[0].tolist()}
            case["logits_file"] = f"{tag}_logits.f32"; case["logits_shape"] = save_f32(os.path.join(d, case["logits_file"]), lg)
            if tag == "short" and out.hidden_states is not None:
                hs = torch.stack([h[0] for h in out.hidden_states])
                case["hidden_file"] = f"{tag}_hidden.f32"; case["hidden_shape"] = save_f32(os.path.join(d, case["hidden_file"]), hs)
                case["hidden_note"] = "hidden_states[0]=embeddings output, [i]=after layer i (last entry is after final norm in HF convention)"
            g = model.generate(input_ids=ids, max_new_tokens=gen, do_sample=False, use_cache=True, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
            new = g.sequences[0, ids.shape[1]:].tolist()
            sc = torch.stack([s[0] for s in g.scores])
            top2 = torch.topk(sc, 2, dim=-1).values
            case["greedy_ids"] = new
            case["greedy_margin"] = (top2[:, 0] - top2[:, 1]).tolist()
            man["cases"].append(case)
            P(name, tag, "n", n, "logits", case["logits_shape"], "min margin %.4f" % min(case["greedy_margin"]), "absmax logit %.3f" % lg.abs().max().item())
        if extra: extra(model, d, man)
        json.dump(man, open(os.path.join(d, "expected.json"), "w"), indent=1)
    except Exception as ex:
        P("FAILED", name, repr(ex)); traceback.print_exc(file=log); traceback.print_exc()

from transformers import AutoConfig, AutoModelForCausalLM
def cfg(model_type, **kw):
    return AutoConfig.for_model(model_type, **kw)

common = dict(vocab_size=VOCAB, initializer_range=0.08, rms_norm_eps=1e-6, tie_word_embeddings=False)
# Qwen3.5 dense text, full composite (text+vision) to match real checkpoint naming
def build_qwen35():
    text = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=8,
                layer_types=["linear_attention"]*3 + ["full_attention"] + ["linear_attention"]*3 + ["full_attention"],
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
                initializer_range=0.08, tie_word_embeddings=True, max_position_embeddings=4096)
    c = cfg("qwen3_5", text_config=text, vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=128, patch_size=16, spatial_merge_size=2, temporal_patch_size=2), tie_word_embeddings=True)
    c.save_pretrained("/tmp/q35cfg")
    from transformers import AutoModelForImageTextToText
    try:
        return AutoModelForImageTextToText.from_config(c, torch_dtype=torch.float32)
    except Exception as ex:
        P("composite qwen3_5 failed, falling back to text", ex)
        return AutoModelForCausalLM.from_config(cfg("qwen3_5_text", **text))
def build_qwen35_text():
    return AutoModelForCausalLM.from_config(cfg("qwen3_5_text", vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                layer_types=["linear_attention"]*3 + ["full_attention"], num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                initializer_range=0.08, tie_word_embeddings=False))
def build_qwen35moe():
    return AutoModelForCausalLM.from_config(cfg("qwen3_5_moe_text", vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4,
                layer_types=["linear_attention"]*3 + ["full_attention"], num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                initializer_range=0.08, tie_word_embeddings=False))
def build_gemma4():
    n = 6
    return AutoModelForCausalLM.from_config(cfg("gemma4_text", vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=128, intermediate_size=256,
                num_hidden_layers=n, layer_types=["sliding_attention"]*2 + ["full_attention"] + ["sliding_attention"]*2 + ["full_attention"],
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, per_layer_config={"02": {"head_dim": 64}, "05": {"head_dim": 64}},
                hidden_size_per_layer_input=16, sliding_window=16, initializer_range=0.08, max_position_embeddings=4096))
def build_qwen3():
    return AutoModelForCausalLM.from_config(cfg("qwen3", vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, initializer_range=0.08, tie_word_embeddings=True))
def build_qwen2():
    return AutoModelForCausalLM.from_config(cfg("qwen2", vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, initializer_range=0.08, tie_word_embeddings=True))
def build_llama():
    return AutoModelForCausalLM.from_config(cfg("llama", vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, initializer_range=0.08, tie_word_embeddings=True))
def build_gemma3():
    return AutoModelForCausalLM.from_config(cfg("gemma3_text", vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=1, head_dim=32, sliding_window=16, layer_types=["sliding_attention"]*3+["full_attention"],
                initializer_range=0.08, max_position_embeddings=4096))
def build_qwen3moe():
    return AutoModelForCausalLM.from_config(cfg("qwen3_moe", vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                initializer_range=0.08, norm_topk_prob=True))

# ---------- configurations the base set does not exercise (anna's extra fixtures) ----------
LONG, EXTRA = {}, {}
def build_qwen35_x():
    # Hv/Hk = 3, dk != dv, other rotary fraction, another layer pattern, one KV head
    return AutoModelForCausalLM.from_config(cfg("qwen3_5_text", vocab_size=VOCAB, hidden_size=96, intermediate_size=160, num_hidden_layers=5,
                layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"],
                num_attention_heads=3, num_key_value_heads=1, head_dim=32,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
                linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4,
                initializer_range=0.08, tie_word_embeddings=True))
LONG["qwen3_5_x"] = 300
def fuse_experts(model, d, man):
    # Rewrite per-expert tensors into the fused layout real Qwen3.5-MoE checkpoints use.
    from safetensors.torch import load_file, save_file
    import re
    f = os.path.join(d, "model.safetensors")
    sd = load_file(f); out = {}; per = {}
    for k, v in sd.items():
        m = re.match(r"(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", k)
        if m: per.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = v
        else: out[k] = v
    for pre, ex in per.items():
        E = len(ex)
        out[pre + ".gate_up_proj"] = torch.stack([torch.cat([ex[e]["gate"], ex[e]["up"]], 0) for e in range(E)]).contiguous()
        out[pre + ".down_proj"] = torch.stack([ex[e]["down"] for e in range(E)]).contiguous()
    save_file(out, f, metadata={"format": "pt"})
    man["note"] = "experts stored fused: mlp.experts.gate_up_proj [E, 2I, H], mlp.experts.down_proj [E, H, I]"
def build_qwen35moe_fused():
    return AutoModelForCausalLM.from_config(cfg("qwen3_5_moe_text", vocab_size=VOCAB, hidden_size=128, num_hidden_layers=4,
                layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"], num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                num_experts=6, num_experts_per_tok=3, moe_intermediate_size=48, shared_expert_intermediate_size=80,
                initializer_range=0.08, tie_word_embeddings=False))
EXTRA["qwen3_5_moe_fused"] = fuse_experts
def build_gemma4_kv():
    # attention_k_eq_v on full layers, KV sharing over the last 3 layers, double-wide MLP there, logit softcap
    n = 7
    return AutoModelForCausalLM.from_config(cfg("gemma4_text", vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, hidden_size=128, intermediate_size=192,
                num_hidden_layers=n, layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True,
                num_kv_shared_layers=3, use_double_wide_mlp=True, final_logit_softcapping=30.0,
                hidden_size_per_layer_input=8, sliding_window=12, initializer_range=0.08, max_position_embeddings=4096))
def build_gemma4_moe():
    n = 4
    return AutoModelForCausalLM.from_config(cfg("gemma4_text", vocab_size=VOCAB, hidden_size=128, intermediate_size=96,
                num_hidden_layers=n, layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=2, attention_k_eq_v=True,
                enable_moe_block=True, num_experts=6, top_k_experts=2, moe_intermediate_size=40, hidden_size_per_layer_input=0,
                final_logit_softcapping=30.0, sliding_window=20, initializer_range=0.08, max_position_embeddings=4096))
def build_gemma3_x():
    return AutoModelForCausalLM.from_config(cfg("gemma3_text", vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=24, query_pre_attn_scalar=48,
                rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}, "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                initializer_range=0.08, max_position_embeddings=4096))
def build_llama3():
    return AutoModelForCausalLM.from_config(cfg("llama", vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                num_attention_heads=8, num_key_value_heads=2, initializer_range=0.08, tie_word_embeddings=False,
                rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}))
def build_qwen3moe_x():
    return AutoModelForCausalLM.from_config(cfg("qwen3_moe", vocab_size=VOCAB, hidden_size=128, intermediate_size=192, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=3, moe_intermediate_size=48,
                decoder_sparse_step=2, mlp_only_layers=[3], initializer_range=0.08, norm_topk_prob=False))

only = set(sys.argv[2:])
for name, b in [("qwen3_5_x", build_qwen35_x), ("qwen3_5_moe_fused", build_qwen35moe_fused), ("gemma4_kv", build_gemma4_kv),
                ("gemma4_moe", build_gemma4_moe), ("gemma3_x", build_gemma3_x), ("llama3", build_llama3), ("qwen3moe_x", build_qwen3moe_x),
                ("qwen3_5", build_qwen35), ("qwen3_5_text", build_qwen35_text), ("qwen3_5_moe_text", build_qwen35moe),
                ("gemma4_text", build_gemma4), ("qwen3", build_qwen3), ("qwen2", build_qwen2), ("llama", build_llama),
                ("gemma3_text", build_gemma3), ("qwen3_moe", build_qwen3moe)]:
    if only and name not in only: continue
    run_case(name, b)
P("done")
