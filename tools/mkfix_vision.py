# Builds tests/fixtures/qwen3_5_vision: transformers' Qwen3.5 vision tower (and the full
# multimodal model) on the tiny random `shared/fixtures/qwen3_5` checkpoint, for
# tests/engine/test_vision.c.
#
#   ~/.cache/anna/venvs/hf/bin/python tools/mkfix_vision.py [FIXTURES_DIR [OUT_DIR]]
#   (defaults: ../shared/fixtures and tests/fixtures/qwen3_5_vision; torch on the CPU, f32)
#
# Deterministic: every input comes from a seeded numpy generator, so a re-run writes the same
# bytes (given the same transformers/torch builds). Cases (grids are (t, h, w) in 16-px patches):
#   img_4x4     one image (1,4,4)
#   img_6x10    one image (1,6,10)
#   img_12x8    one image (1,12,8)
#   two_images  two images (1,4,6) and (1,8,4) in one tower call (attention must not cross them)
#   video       a 4-frame clip (2,4,6): two temporal groups, attention within each group only
# Per case: <case>.pix.u8 holds the pixel bytes x (uint8) of pixel_values [n_patches, 1536],
# where pixel_values = (x / 255 - 0.5) / 0.5 in f32 (the processor's rescale + normalise, so a
# byte store loses nothing); images repeat their frame over the 2 temporal slots as the
# processor does. <case>.tower.f32 is the merger output [sum t*h*w/4, 128].
# End to end: the fixture's vocabulary has 1000 ids but image_token_id is 248056, so the model
# is loaded with a config copy (written here as config.json) whose image/video/vision-start/
# vision-end ids are 995/996/997/998. The prompt per case is text ids, then per image
# <vision_start> pads <vision_end> (video: per temporal group two "timestamp" text ids, then
# start, pads, end), then text ids; <case>.logits.f32 holds every row's logits [seq, 1000] and
# expected.json the prompt ids, 3-axis positions (get_rope_index), greedy ids (6 new tokens).
#
# Bench mode (a real-shape tower with random weights, for bench/notes/vision.md):
#   mkfix_vision.py --shape 0.8b|4b|9b OUT_DIR [H W [THREADS]]
# writes OUT_DIR/config.json + model.safetensors (model.visual.* only, f32, seeded normal(0, 0.02)
# weights, LayerNorm weights 1 + normal(0, 0.02)), one image's pixel_values (grid (1, H, W) in
# patches, default 28 x 28 = 448 x 448 px) as bench.pix.f32, transformers' tower rows as
# bench.tower.f32, bench.json (grid, shapes) and the median wall and process-CPU seconds of 3
# timed tower calls (sdpa, f32, torch.set_num_threads(THREADS), default 2). `test_vision --bench OUT_DIR` then times anna on
# the same input and checks its rows against these.
import json, os, shutil, sys, tempfile, time

import numpy as np
import torch
import transformers
from transformers import Qwen3_5ForConditionalGeneration

SHAPES = {  # MODELS.md "Published towers": depth, hidden, heads, intermediate, out_hidden
    "0.8b": (12, 768, 12, 3072, 1024),
    "4b": (24, 1024, 16, 4096, 2560),
    "9b": (27, 1152, 16, 4304, 4096),
}


def bench_shape(name, out, gh=28, gw=28, threads=2):
    from safetensors.torch import save_file
    from transformers import Qwen3_5Config
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel
    depth, hid, heads, inter, outh = SHAPES[name]
    os.makedirs(out, exist_ok=True)
    vc = {"depth": depth, "hidden_size": hid, "num_heads": heads, "intermediate_size": inter,
          "out_hidden_size": outh, "in_channels": 3, "patch_size": 16, "temporal_patch_size": 2,
          "spatial_merge_size": 2, "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh",
          "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0}, "model_type": "qwen3_5_vision"}
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "vision_config": vc,
           "text_config": {"model_type": "qwen3_5_text", "hidden_size": outh}}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    config = Qwen3_5Config(vision_config=vc)
    config.vision_config._attn_implementation = "sdpa"
    torch.manual_seed(7)
    tower = Qwen3_5VisionModel._from_config(config.vision_config, dtype=torch.float32).eval()
    sd = {}
    for k, v in tower.state_dict().items():
        w = torch.randn(v.shape) * 0.02
        if k.endswith("norm1.weight") or k.endswith("norm2.weight") or k.endswith("norm.weight"):
            w += 1
        sd[k] = w
    tower.load_state_dict(sd)
    save_file({"model.visual." + k: v.contiguous() for k, v in sd.items()}, os.path.join(out, "model.safetensors"))
    n = gh * gw
    rng = np.random.default_rng(11)
    x = rng.integers(0, 256, size=(n, 3, 1, 16, 16), dtype=np.uint8).repeat(2, axis=2).reshape(n, PD_BENCH)
    pv = torch.from_numpy((x.astype(np.float32) / np.float32(255) - np.float32(0.5)) / np.float32(0.5))
    thw = torch.tensor([[1, gh, gw]])
    torch.set_num_threads(threads)
    rows = tower(pv, grid_thw=thw).pooler_output
    ts, cs = [], []
    for _ in range(3):
        t0, c0 = time.perf_counter(), time.process_time()
        tower(pv, grid_thw=thw)
        ts.append(time.perf_counter() - t0)
        cs.append(time.process_time() - c0)
    pv.numpy().astype("<f4").tofile(os.path.join(out, "bench.pix.f32"))
    rows.numpy().astype("<f4").tofile(os.path.join(out, "bench.tower.f32"))
    info = {"shape": name, "grid_thw": [1, gh, gw], "n_patches": n, "patch_dim": PD_BENCH,
            "tower_rows": int(rows.shape[0]), "out_hidden": outh, "threads": threads,
            "transformers_s": sorted(ts)[1], "transformers_cpu_s": sorted(cs)[1],
            "transformers": transformers.__version__, "torch": torch.__version__}
    json.dump(info, open(os.path.join(out, "bench.json"), "w"), indent=1)
    print(json.dumps(info))


PD_BENCH = 3 * 2 * 16 * 16
if len(sys.argv) > 1 and sys.argv[1] == "--shape":
    torch.set_grad_enabled(False)
    a = sys.argv[2:]
    bench_shape(a[0], a[1], *(int(v) for v in a[2:5]))
    sys.exit(0)

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "shared", "fixtures")
OUT = sys.argv[2] if len(sys.argv) > 2 else os.path.join(HERE, "..", "tests", "fixtures", "qwen3_5_vision")
SRC = os.path.join(FIX, "qwen3_5")
IMG, VID, VSTART, VEND = 995, 996, 997, 998
N_GEN = 6

torch.set_grad_enabled(False)
torch.manual_seed(0)
os.makedirs(OUT, exist_ok=True)

cfg = json.load(open(os.path.join(SRC, "config.json")))
cfg.update(image_token_id=IMG, video_token_id=VID, vision_start_token_id=VSTART, vision_end_token_id=VEND)
tmp = tempfile.mkdtemp()
json.dump(cfg, open(os.path.join(tmp, "config.json"), "w"), indent=2)
json.dump(cfg, open(os.path.join(OUT, "config.json"), "w"), indent=2)
os.symlink(os.path.abspath(os.path.join(SRC, "model.safetensors")), os.path.join(tmp, "model.safetensors"))
model = Qwen3_5ForConditionalGeneration.from_pretrained(tmp, dtype=torch.float32).eval()
shutil.rmtree(tmp)
vc = cfg["vision_config"]
PD = vc["in_channels"] * vc["temporal_patch_size"] * vc["patch_size"] ** 2
M = vc["spatial_merge_size"]

CASES = [
    ("img_4x4", [(1, 4, 4)], False, 1),
    ("img_6x10", [(1, 6, 10)], False, 2),
    ("img_12x8", [(1, 12, 8)], False, 3),
    ("two_images", [(1, 4, 6), (1, 8, 4)], False, 4),
    ("video", [(2, 4, 6)], True, 5),
]


def pixels_u8(grids, video, seed):
    """Bytes [n_patches, 1536] in patch order (c, t, y, x): images copy t=0 to t=1."""
    rng = np.random.default_rng(seed)
    n = sum(t * h * w for t, h, w in grids)
    x = rng.integers(0, 256, size=(n, 3, 2, 16, 16), dtype=np.uint8)
    if not video:
        x[:, :, 1] = x[:, :, 0]
    return x.reshape(n, PD)


def prompt(grids, video, seed):
    rng = np.random.default_rng(1000 + seed)
    text = lambda k: [int(v) for v in rng.integers(1, 990, size=k)]
    ids, types = text(3), [0, 0, 0]
    for t, h, w in grids:
        pads = h * w // (M * M)
        for g in range(t if video else 1):
            if video:
                ids += text(2)
                types += [0, 0]
            ids += [VSTART] + [VID if video else IMG] * (pads if video else t * pads) + [VEND]
            types += [0] + [2 if video else 1] * (pads if video else t * pads) + [0]
    ids += text(2)
    types += [0, 0]
    return ids, types


expected = {"transformers": transformers.__version__, "torch": torch.__version__,
            "source": "shared/fixtures/qwen3_5 (model.visual.* and the text model)",
            "token_ids": {"image": IMG, "video": VID, "vision_start": VSTART, "vision_end": VEND},
            "n_gen": N_GEN, "cases": []}
for name, grids, video, seed in CASES:
    u8 = pixels_u8(grids, video, seed)
    pv = torch.from_numpy((u8.astype(np.float32) / np.float32(255) - np.float32(0.5)) / np.float32(0.5))
    thw = torch.tensor(grids, dtype=torch.long)
    tower = model.model.visual(pv, grid_thw=thw).pooler_output
    u8.tofile(os.path.join(OUT, name + ".pix.u8"))
    tower.numpy().astype("<f4").tofile(os.path.join(OUT, name + ".tower.f32"))

    ids, types = prompt(grids, video, seed)
    inp = torch.tensor([ids])
    tt = torch.tensor([types], dtype=torch.int32)
    kw = dict(pixel_values_videos=pv, video_grid_thw=thw) if video else dict(pixel_values=pv, image_grid_thw=thw)
    pos, delta = model.model.get_rope_index(inp, tt, image_grid_thw=None if video else thw,
                                            video_grid_thw=thw if video else None)
    out = model(input_ids=inp, mm_token_type_ids=tt, **kw)
    logits = out.logits[0]
    logits.numpy().astype("<f4").tofile(os.path.join(OUT, name + ".logits.f32"))
    gen = model.generate(input_ids=inp, mm_token_type_ids=tt, attention_mask=torch.ones_like(inp),
                         max_new_tokens=N_GEN, do_sample=False, **kw)
    greedy = [int(v) for v in gen[0, len(ids):]]
    assert greedy[0] == int(logits[-1].argmax()), "generate disagrees with the forward pass"
    assert not set(greedy) & {IMG, VID}, "a greedy id is a vision pad: pick other seeds"
    expected["cases"].append({
        "name": name, "video": video, "grid_thw": [list(g) for g in grids],
        "n_patches": int(u8.shape[0]), "patch_dim": PD, "tower_rows": int(tower.shape[0]),
        "out_hidden": int(tower.shape[1]),
        "prompt_ids": ids, "mm_token_type_ids": types,
        "positions_thw": pos[:, 0].tolist(), "rope_delta": int(delta[0, 0]),
        "logits_shape": list(logits.shape), "greedy_ids": greedy,
    })
    print(f"{name}: patches {u8.shape[0]} tower {tuple(tower.shape)} seq {len(ids)} greedy {greedy}")
json.dump(expected, open(os.path.join(OUT, "expected.json"), "w"), indent=1)
