# Builds the YaRN reference fixtures (tests/fixtures/qwen3_yarn, tests/fixtures/qwen3_5_yarn):
# tiny random-weight models with rope scaling, saved like tools/mkfix.py does (config.json +
# bf16 model.safetensors + expected.json with all-position logits and greedy ids), but with no
# tokenizer: tests/engine/test_fixtures.c reads prompt ids, never text.
#
#   python3 tools/mkfix_rope.py OUT_DIR        (needs torch + transformers 5; CPU is enough)
#   then copy OUT_DIR/qwen3_yarn and OUT_DIR/qwen3_5_yarn into tests/fixtures/
#
# What they check: positions past original_max_position_embeddings (64) with YaRN factor 4,
# so the inv_freq blend and the attention factor (0.1 ln 4 + 1, which transformers multiplies
# into cos and sin) both matter. qwen3_yarn is fully rotary (anna folds factor^2 into the
# score scale); qwen3_5_yarn rotates half of each head and has zero-centred q/k norms (anna
# folds the factor into those norm weights). Each folder stays under 600 KB.
import json, os, sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from safetensors.torch import load_file, save_file

if len(sys.argv) != 2:
    sys.exit("usage: mkfix_rope.py OUT_DIR")
OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
torch.set_grad_enabled(False)
print("transformers", transformers.__version__, "torch", torch.__version__)

VOCAB = 512
N_SHORT, N_LONG, GEN = 16, 180, 24
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}


def save_f32(path, t):
    a = t.detach().float().contiguous().cpu().numpy().astype("<f4")
    a.tofile(path)
    return list(a.shape)


def prompt(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(20, VOCAB, (1, n), generator=g)


def run(name, config):
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    # bf16-round the weights (checkpoints are bf16) and keep the compute in f32, like mkfix.py
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16).float())
    model.save_pretrained(d, safe_serialization=True)
    for f in [os.path.join(d, x) for x in os.listdir(d) if x.endswith(".safetensors")]:
        sd = load_file(f)
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}, f, metadata={"format": "pt"})
    saved = json.load(open(os.path.join(d, "config.json")))
    rp = saved.get("rope_parameters") or saved.get("rope_scaling")
    rot = next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    print(name, "rope_parameters", rp, "attention_scaling", getattr(rot, "attention_scaling", None))
    assert (rp or {}).get("rope_type") == "yarn", "the saved config lost the yarn rope type"
    assert abs(rot.attention_scaling - 1.0) > 0.1, "transformers did not apply a YaRN attention factor"
    man = {"model": name, "class": type(model).__name__, "vocab": VOCAB, "cases": [],
           "note": "YaRN factor 4 over original_max_position_embeddings 64; tools/mkfix_rope.py"}
    for tag, n, seed in (("short", N_SHORT, 1), ("long", N_LONG, 2)):
        ids = prompt(n, seed)
        lg = model(input_ids=ids, use_cache=False).logits[0]
        case = {"tag": tag, "prompt_ids": ids[0].tolist(), "logits_file": f"{tag}_logits.f32"}
        case["logits_shape"] = save_f32(os.path.join(d, case["logits_file"]), lg)
        g = model.generate(input_ids=ids, max_new_tokens=GEN, do_sample=False, use_cache=True, output_scores=True,
                           return_dict_in_generate=True, pad_token_id=0)
        sc = torch.stack([s[0] for s in g.scores])
        top2 = torch.topk(sc, 2, dim=-1).values
        case["greedy_ids"] = g.sequences[0, ids.shape[1]:].tolist()
        case["greedy_margin"] = (top2[:, 0] - top2[:, 1]).tolist()
        man["cases"].append(case)
        print(name, tag, "n", n, "logits", case["logits_shape"], "min margin %.4f" % min(case["greedy_margin"]),
              "absmax logit %.3f" % lg.abs().max().item())
    json.dump(man, open(os.path.join(d, "expected.json"), "w"), indent=1)
    total = 0
    for x in sorted(os.listdir(d)):
        sz = os.path.getsize(os.path.join(d, x))
        total += sz
        print("  wrote %s/%s (%d bytes)" % (d, x, sz))
    print("  total %d bytes" % total)
    assert total < 600 * 1024, "fixture over 600 KB"


# Qwen3: full rotary (head_dim 32, all of it rotated), q/k RMSNorm, tied embeddings.
run("qwen3_yarn", AutoConfig.for_model(
    "qwen3", vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
    rope_parameters=dict(YARN), initializer_range=0.08, rms_norm_eps=1e-6, tie_word_embeddings=True))

# Qwen3.5 text: half of each 32-dim head rotated (16 dims, interleaved M-RoPE sections summing
# to 8 frequencies; text positions make it plain rope), gated attention, one GDN layer.
run("qwen3_5_yarn", AutoConfig.for_model(
    "qwen3_5_text", vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
    layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1, head_dim=32,
    linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, max_position_embeddings=256,
    rope_parameters=dict(YARN, partial_rotary_factor=0.5, mrope_section=[4, 2, 2], mrope_interleaved=True),
    initializer_range=0.08, rms_norm_eps=1e-6, tie_word_embeddings=True))
print("done")
