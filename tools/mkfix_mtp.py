# Tiny random Qwen3.5 text models (dense and MoE) with a multi-token-prediction (MTP) head
# (`mtp.*` tensors) and reference outputs of that head, for anna's MTP drafter tests.
#
# transformers loads Qwen3.5 checkpoints but drops `mtp.*` (_keys_to_ignore_on_load_unexpected),
# so the head's forward is written here from the checkpoint definition (vLLM qwen3_5_mtp.py,
# llama.cpp qwen35.cpp graph_mtp), built from transformers' own Qwen3.5 modules:
#   x   = fc(concat(pre_fc_norm_embedding(embed(tok_{t+1})), pre_fc_norm_hidden(h_t)))   fc: [H, 2H]
#   y   = one full-attention Qwen3.5 decoder layer (gated attention, q/k norm, partial rope;
#         the MoE block in MoE checkpoints) over x, causal over the head's own KV
#   out = norm(y) (mtp.norm), logits = lm_head(out)
# h_t is the main model's hidden state after its final norm; the pair (h_t, tok_{t+1}) sits at
# rotary position t (vLLM; llama.cpp uses t + 1: rope is relative, every key shifts alike, so
# the two agree). Chained drafts feed `out` back as h.
#
# usage: python3 tools/mkfix_mtp.py OUTDIR   (writes OUTDIR/dense and OUTDIR/moe)
import copy, json, os, shutil, sys
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

OUT = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
TOK = os.path.join(HERE, "..", "..", "shared", "fixtures", "qwen3_5_text")  # the shared fixtures' tokenizer
if len(sys.argv) > 2: TOK = sys.argv[2]
torch.manual_seed(0)
torch.set_grad_enabled(False)
VOCAB = 1000


def bf16(t):
    return t.to(torch.bfloat16).float()


def save_f32(path, t):
    t.detach().float().contiguous().cpu().numpy().astype("<f4").tofile(path)
    return list(t.shape)


class MTPHead(torch.nn.Module):
    def __init__(self, tcfg, layer_cls, norm_cls):
        super().__init__()
        H = tcfg.hidden_size
        c = copy.deepcopy(tcfg)
        c.layer_types = ["full_attention"]
        c.num_hidden_layers = 1
        c._attn_implementation = "eager"
        self.fc = torch.nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = norm_cls(H, eps=tcfg.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_cls(H, eps=tcfg.rms_norm_eps)
        self.norm = norm_cls(H, eps=tcfg.rms_norm_eps)
        self.layers = torch.nn.ModuleList([layer_cls(c, 0)])

    def forward(self, model, tokens, h, pos):
        """tokens [T], h [T, H], pos [T]: one causal pass; returns (post-norm out [T, H], logits)."""
        e = model.model.embed_tokens(tokens[None])
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(h[None])], dim=-1))
        T = tokens.shape[0]
        pe = model.model.rotary_emb(x, pos[None])
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        y = self.layers[0](x, position_embeddings=pe, attention_mask=mask, position_ids=pos[None])
        if isinstance(y, tuple): y = y[0]
        out = self.norm(y)
        return out[0], model.lm_head(out)[0]


def build(kind):
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4,
                  layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_conv_kernel_dim=4, initializer_range=0.1, rms_norm_eps=1e-6,
                  max_position_embeddings=4096, mtp_num_hidden_layers=1)
    if kind == "dense":
        cfg = AutoConfig.for_model("qwen3_5_text", intermediate_size=64, tie_word_embeddings=True, **common)
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer as L, Qwen3_5RMSNorm as N
    else:
        cfg = AutoConfig.for_model("qwen3_5_moe_text", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                   shared_expert_intermediate_size=32, tie_word_embeddings=False, **common)
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer as L, Qwen3_5MoeRMSNorm as N
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).eval()
    head = MTPHead(model.config, L, N).eval()
    for p in head.parameters(): torch.nn.init.normal_(p, 0.0, 0.1)
    # zero-centred (1 + w) norms: random w so a wrong norm convention shows
    for mod in list(model.modules()) + list(head.modules()):
        if isinstance(mod, N): torch.nn.init.normal_(mod.weight, 0.0, 0.3)
    for p in list(model.parameters()) + list(head.parameters()): p.copy_(bf16(p))
    return model, head


def run(kind, n_prompt=20, n_gen=24, n_chain=4, n_logit_rows=16):
    d = os.path.join(OUT, kind)
    os.makedirs(d, exist_ok=True)
    model, head = build(kind)
    model.save_pretrained(d, safe_serialization=True)
    st = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            st.update(load_file(os.path.join(d, f)))
            os.remove(os.path.join(d, f))
    for k, v in head.state_dict().items(): st["mtp." + k] = v
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in st.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    if kind == "dense":  # the MoE case is driven by ids (keeps the folder small)
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(os.path.join(TOK, f), os.path.join(d, f))

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(20, VOCAB, (n_prompt,), generator=g)
    # main model: greedy continuation (HF generate) and final-norm hidden states of prompt + continuation
    gen = model.generate(input_ids=ids[None], max_new_tokens=n_gen, do_sample=False, use_cache=True, pad_token_id=0,
                         output_scores=True, return_dict_in_generate=True)
    seq = gen.sequences[0]
    new = seq[n_prompt:].tolist()
    sc = torch.stack([s[0] for s in gen.scores])
    top2 = torch.topk(sc, 2, dim=-1).values
    cap = {}
    hk = model.model.norm.register_forward_hook(lambda m, i, o: cap.__setitem__("h", o))
    T = seq.shape[0] - 1  # the last generated token was never fed
    model(input_ids=seq[None, :T], use_cache=False)
    hk.remove()
    h = cap["h"][0]  # [T, H]
    # MTP over the pairs (h_t, tok_{t+1}), t = 0 .. T-1, positions t, one causal pass
    pos = torch.arange(T)
    out, lg = head(model, seq[1:T + 1], h, pos)
    # a chain after the prompt: the head's KV holds pairs 0 .. n_prompt-2; pair n_prompt-1 is
    # (h_{P-1}, first generated token); then each step feeds (out, argmax) at the next position
    P = n_prompt
    toks, hs = seq[1:P + 1].clone(), h[:P].clone()
    chain = []
    for j in range(n_chain):
        o, l = head(model, toks, hs, torch.arange(toks.shape[0]))
        nxt = int(torch.argmax(l[-1]))
        chain.append({"token": nxt, "logits": l[-1]})
        toks = torch.cat([toks, torch.tensor([nxt])])
        hs = torch.cat([hs, o[-1:]])
    man = {
        "kind": kind, "class": type(model).__name__, "transformers": transformers.__version__, "torch": torch.__version__,
        "hidden": model.config.hidden_size, "vocab": VOCAB,
        "prompt_ids": ids.tolist(), "greedy_ids": new, "greedy_margin": (top2[:, 0] - top2[:, 1]).tolist(),
        "n_rows": T,
        "hidden_file": "hidden.f32", "hidden_shape": save_f32(os.path.join(d, "hidden.f32"), h),
        "mtp_logits_file": "mtp_logits.f32", "mtp_logits_shape": save_f32(os.path.join(d, "mtp_logits.f32"), lg[T - n_logit_rows:]),
        "mtp_logits_first_row": T - n_logit_rows,
        "mtp_out_file": "mtp_out.f32", "mtp_out_shape": save_f32(os.path.join(d, "mtp_out.f32"), out),
        "mtp_note": "row t: the MTP head over (hidden row t, token ids[t+1]) at position t, ids = prompt_ids + greedy_ids, "
                    "causal over rows 0..t; mtp_out = the head's post-norm output (every row), mtp_logits = rows "
                    "mtp_logits_first_row .. n_rows-1 (size)",
        "chain_tokens": [c["token"] for c in chain],
        "chain_logits_file": "chain_logits.f32",
        "chain_logits_shape": save_f32(os.path.join(d, "chain_logits.f32"), torch.stack([c["logits"] for c in chain])),
        "chain_note": "after rows 0..P-2 and row P-1 (h_{P-1}, greedy_ids[0]), each step feeds (previous post-norm out, "
                      "its argmax) at the next position; P = len(prompt_ids)",
    }
    json.dump(man, open(os.path.join(d, "expected.json"), "w"), indent=1)
    # the MTP acceptance a greedy drafter would get on this continuation (random weights: low)
    pred = torch.argmax(lg, -1)
    hit = (pred[P - 1:T - 1] == seq[P + 1:T + 1]).float().mean().item()
    print(kind, "rows", T, "mtp next-next top-1 agreement on the continuation %.3f" % hit,
          "chain", man["chain_tokens"], "min margin %.4f" % min(man["greedy_margin"]))


for k in ("dense", "moe"):
    run(k)
