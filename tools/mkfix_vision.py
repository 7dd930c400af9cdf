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

# End-to-end mode (issue 24 items 3-5; tests/engine/test_vision_api.c, cli_generate_image,
# tests/server/test_vision.py):
#   mkfix_vision.py --e2e [FIXTURES_DIR [OUT_DIR]]   (OUT_DIR default tests/fixtures/qwen3_5_vision/e2e)
# Starts from image FILES: writes two small images (PNG and JPEG, seeded smooth patterns), a
# config copy whose image / vision start / vision end ids are the fixture tokenizer's own
# <|image_pad|> 9, <|vision_start|> 7, <|vision_end|> 8, the shared chat template extended with
# content parts (one <|vision_start|><|image_pad|><|vision_end|> per image part, as Qwen's
# template does), and a preprocessor_config.json with small min / max pixels (1024 .. 16384)
# so each image is a few tokens. Per case, transformers does everything: PIL opens the files,
# Qwen2VLImageProcessor makes pixel_values, the tokenizer renders the chat template, the pad
# expands to t*h*w/4 ids (the processor's rule), and generate() gives N_E2E greedy ids.
# expected.json: messages, prompt_ids (expanded), grids, greedy_ids; <case>.last_logits.f32 the
# logits of the last prompt row [1000], <case>.step_logits.f32 those of every generate step
# [N_E2E, 1000] (step 0 is the last prompt row). The weights and tokenizer stay the shared fixture's:
# the tests link them next to these files.
N_E2E = 8
E2E_IDS = {"image_token_id": 9, "vision_start_token_id": 7, "vision_end_token_id": 8, "video_token_id": 996}
E2E_PRE = {"size": {"shortest_edge": 1024, "longest_edge": 16384}, "patch_size": 16, "temporal_patch_size": 2,
           "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
           "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "rescale_factor": 1 / 255,
           "image_processor_type": "Qwen2VLImageProcessor"}
E2E_USER = """{%- elif m.role == 'user' or m.role == 'system' -%}
<|im_start|>{{ m.role }}
{% if m.content is string %}{{ m.content }}{% else %}{% for part in m.content %}{% if part.type == 'image' or part.type == 'image_url' %}<|vision_start|><|image_pad|><|vision_end|>{% elif part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}{% endif %}<|im_end|>
"""


def e2e(fix, out):
    from PIL import Image
    from transformers import AutoTokenizer, Qwen2VLImageProcessor
    src = os.path.join(fix, "qwen3_5")
    os.makedirs(out, exist_ok=True)
    tpl = open(os.path.join(src, "chat_template.jinja")).read()
    old = "{%- elif m.role == 'user' or m.role == 'system' -%}\n<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    assert old in tpl, "the shared chat template changed: update E2E_USER"
    open(os.path.join(out, "chat_template.jinja"), "w").write(tpl.replace(old, E2E_USER))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.update(E2E_IDS)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    json.dump(E2E_PRE, open(os.path.join(out, "preprocessor_config.json"), "w"), indent=2)
    # images: smooth seeded patterns (JPEG of noise would be all artefacts)
    rng = np.random.default_rng(24)
    def pattern(h, w):
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        a = rng.uniform(0.02, 0.2, size=(3, 2))
        ph = rng.uniform(0, 6.28, size=3)
        img = np.stack([127.5 + 120 * np.sin(a[c, 0] * x + a[c, 1] * y + ph[c]) for c in range(3)], -1)
        return Image.fromarray(img.clip(0, 255).astype(np.uint8), "RGB")
    pattern(64, 90).save(os.path.join(out, "wide.png"))
    pattern(120, 64).save(os.path.join(out, "tall.jpg"), quality=90)
    tmp = tempfile.mkdtemp()
    for f in ("tokenizer.json", "tokenizer_config.json", "model.safetensors"):
        os.symlink(os.path.abspath(os.path.join(src, f)), os.path.join(tmp, f))
    for f in ("config.json", "chat_template.jinja", "preprocessor_config.json"):
        shutil.copy(os.path.join(out, f), os.path.join(tmp, f))
    tok = AutoTokenizer.from_pretrained(tmp)
    proc = Qwen2VLImageProcessor(**{k: v for k, v in E2E_PRE.items() if k != "image_processor_type"})
    model = Qwen3_5ForConditionalGeneration.from_pretrained(tmp, dtype=torch.float32).eval()
    shutil.rmtree(tmp)
    cases = [
        ("one_image", ["wide.png"], [{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "What is in this picture?"}]}]),
        ("two_images", ["wide.png", "tall.jpg"], [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"},
                                         {"type": "text", "text": " and "}, {"type": "image"}]}]),
        # the order anna-generate --image builds: images, then the text
        ("cli_two_images", ["wide.png", "tall.jpg"], [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                         {"type": "text", "text": "Compare them."}]}]),
    ]
    exp = {"transformers": transformers.__version__, "torch": torch.__version__, "n_gen": N_E2E,
           "token_ids": E2E_IDS, "cases": []}
    for name, files, msgs in cases:
        imgs = [Image.open(os.path.join(out, f)) for f in files]
        px = proc(images=imgs, return_tensors="pt")
        grids = px["image_grid_thw"].tolist()
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids0 = tok(text, add_special_tokens=False)["input_ids"]
        ids, k = [], 0
        for t in ids0:  # the processor's expansion: one pad -> t*h*w/merge^2 pads
            if t == E2E_IDS["image_token_id"]:
                g = grids[k]
                ids += [t] * (g[0] * g[1] * g[2] // 4)
                k += 1
            else:
                ids.append(t)
        assert k == len(files)
        inp = torch.tensor([ids])
        tt = (inp == E2E_IDS["image_token_id"]).to(torch.int32)
        kw = dict(pixel_values=px["pixel_values"], image_grid_thw=px["image_grid_thw"], mm_token_type_ids=tt)
        logits = model(input_ids=inp, **kw).logits[0, -1]
        gen = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), max_new_tokens=N_E2E,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, **kw)
        greedy = [int(v) for v in gen.sequences[0, len(ids):]]
        assert greedy[0] == int(logits.argmax())
        logits.numpy().astype("<f4").tofile(os.path.join(out, name + ".last_logits.f32"))
        # every step's logits: decode steps after an image rotate at pos + rope delta
        torch.cat(gen.logits, 0).numpy().astype("<f4").tofile(os.path.join(out, name + ".step_logits.f32"))
        exp["cases"].append({"name": name, "images": files, "messages": msgs, "prompt_text": text,
                             "grid_thw": grids, "prompt_ids": ids, "greedy_ids": greedy,
                             "greedy_text": tok.decode(greedy)})
        print(f"{name}: grids {grids} prompt {len(ids)} greedy {greedy}")
    json.dump(exp, open(os.path.join(out, "expected.json"), "w"), indent=1)


# Video end to end (issue 24 video items; tests/engine/test_video_api.c, cli_generate_video,
# tests/server/test_video.py):
#   mkfix_vision.py --e2e-video [FIXTURES_DIR [OUT_DIR]]   (default tests/fixtures/qwen3_5_vision/e2e_video)
# Needs torchcodec (transformers decodes a video path with it): run with the vvid venv's python
# (tools/mkfix_vvid.py says how to make it). The fixture tokenizer has no <|video_pad|>, so this
# folder carries a tokenizer.json copy where the last BPE piece (id 999, 'Glogits', and its one
# merge) gives its id to an added special token <|video_pad|> (HF assigns an added token the next
# free id, so the piece must go); config.json says video_token_id 999. The chat template adds
# video parts as Qwen's does (<|vision_start|><|video_pad|><|vision_end|>), and
# video_preprocessor_config.json is the published one with a small budget (longest_edge 65536
# pixels for the whole clip) so a clip is a few tokens. Per case, Qwen3VLProcessor does
# everything (torchcodec decode, frame sampling, resize, the "<t seconds>" per temporal group
# and the pad expansion), then forward + generate() as in --e2e. Files: the clips (copies of
# tests/fixtures/vision_video clips), <case>.{last,step}_logits.f32, <case>.pix.u8 (the video's
# pixel_values_videos as bytes: mean = std = 0.5, so x = v * 127.5 + 127.5 is exact) and
# <case>.tower.f32 (model.visual on them, [t*h*w/4, 128]), expected.json.
E2EV_IDS = dict(E2E_IDS, video_token_id=999)
E2EV_VPRE = {"size": {"shortest_edge": 4096, "longest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
             "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_resize": True,
             "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "rescale_factor": 1 / 255,
             "fps": 2, "min_frames": 4, "max_frames": 768, "do_sample_frames": True,
             "video_processor_type": "Qwen3VLVideoProcessor"}
E2EV_PART = ("{% elif part.type == 'text' %}",
             "{% elif part.type == 'video' or part.type == 'video_url' %}<|vision_start|><|video_pad|><|vision_end|>"
             "{% elif part.type == 'text' %}")


def e2e_video(fix, out):
    from PIL import Image
    from transformers import AutoTokenizer, Qwen2VLImageProcessor
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(fix, "qwen3_5")
    e2e_dir = os.path.join(here, "..", "tests", "fixtures", "qwen3_5_vision", "e2e")
    vdir = os.path.join(here, "..", "tests", "fixtures", "vision_video")
    os.makedirs(out, exist_ok=True)
    tpl = open(os.path.join(e2e_dir, "chat_template.jinja")).read()
    assert E2EV_PART[0] in tpl
    open(os.path.join(out, "chat_template.jinja"), "w").write(tpl.replace(E2EV_PART[0], E2EV_PART[1], 1))
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg.update(E2EV_IDS)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)
    json.dump(E2E_PRE, open(os.path.join(out, "preprocessor_config.json"), "w"), indent=2)
    json.dump(E2EV_VPRE, open(os.path.join(out, "video_preprocessor_config.json"), "w"), indent=2)
    tj = json.load(open(os.path.join(src, "tokenizer.json")))
    inv = {v: k for k, v in tj["model"]["vocab"].items()}
    piece = inv[999]
    del tj["model"]["vocab"][piece]
    tj["model"]["merges"] = [x for x in tj["model"]["merges"] if x[0] + x[1] != piece and piece not in x]
    tj["added_tokens"].append({"id": 999, "content": "<|video_pad|>", "single_word": False, "lstrip": False,
                               "rstrip": False, "normalized": False, "special": True})
    json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
    for f in ("h264_96x64.mp4", "vp9_80x60.webm"):
        shutil.copy(os.path.join(vdir, f), os.path.join(out, f))
    shutil.copy(os.path.join(e2e_dir, "wide.png"), os.path.join(out, "wide.png"))
    tmp = tempfile.mkdtemp()
    for f in ("tokenizer_config.json", "model.safetensors"):
        os.symlink(os.path.abspath(os.path.join(src, f)), os.path.join(tmp, f))
    for f in ("config.json", "chat_template.jinja", "preprocessor_config.json", "tokenizer.json"):
        shutil.copy(os.path.join(out, f), os.path.join(tmp, f))
    tok = AutoTokenizer.from_pretrained(tmp)
    assert tok.convert_tokens_to_ids("<|video_pad|>") == 999
    ip = Qwen2VLImageProcessor(**{k: v for k, v in E2E_PRE.items() if k != "image_processor_type"})
    vp = Qwen3VLVideoProcessor(**{k: v for k, v in E2EV_VPRE.items() if k != "video_processor_type"})
    proc = Qwen3VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(tmp, dtype=torch.float32).eval()
    shutil.rmtree(tmp)
    cases = [
        # the order anna-generate --video builds: the video, then the text
        ("video", [], ["h264_96x64.mp4"], [{"role": "user", "content": [
            {"type": "video"}, {"type": "text", "text": "What happens in this video?"}]}]),
        ("video_webm", [], ["vp9_80x60.webm"], [{"role": "user", "content": [
            {"type": "video"}, {"type": "text", "text": "Describe it."}]}]),
        ("image_video", ["wide.png"], ["h264_96x64.mp4"], [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"},
                                         {"type": "text", "text": " with "}, {"type": "video"}]}]),
    ]
    exp = {"transformers": transformers.__version__, "torch": torch.__version__, "n_gen": N_E2E,
           "token_ids": E2EV_IDS, "cases": []}
    for name, imgs, vids, msgs in cases:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        kw = {}
        if imgs:
            kw["images"] = [Image.open(os.path.join(out, f)) for f in imgs]
        inputs = proc(text=[text], videos=[os.path.join(out, f) for f in vids], return_tensors="pt", **kw)
        ids = inputs["input_ids"][0].tolist()
        inp = inputs["input_ids"]
        tt = (inp == E2EV_IDS["image_token_id"]).to(torch.int32) + 2 * (inp == E2EV_IDS["video_token_id"]).to(torch.int32)
        fw = dict(pixel_values_videos=inputs["pixel_values_videos"], video_grid_thw=inputs["video_grid_thw"],
                  mm_token_type_ids=tt)
        if imgs:
            fw.update(pixel_values=inputs["pixel_values"], image_grid_thw=inputs["image_grid_thw"])
        logits = model(input_ids=inp, **fw).logits[0, -1]
        gen = model.generate(input_ids=inp, attention_mask=torch.ones_like(inp), max_new_tokens=N_E2E,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, **fw)
        greedy = [int(v) for v in gen.sequences[0, len(ids):]]
        assert greedy[0] == int(logits.argmax())
        logits.numpy().astype("<f4").tofile(os.path.join(out, name + ".last_logits.f32"))
        torch.cat(gen.logits, 0).numpy().astype("<f4").tofile(os.path.join(out, name + ".step_logits.f32"))
        pv = inputs["pixel_values_videos"]
        b = pv.numpy() * 127.5 + 127.5
        assert np.abs(b - np.round(b)).max() < 1e-3
        np.round(b).astype(np.uint8).tofile(os.path.join(out, name + ".pix.u8"))
        tower = model.model.visual(pv, grid_thw=inputs["video_grid_thw"]).pooler_output
        tower.numpy().astype("<f4").tofile(os.path.join(out, name + ".tower.f32"))
        full = proc.tokenizer.decode(ids)
        exp["cases"].append({"name": name, "images": imgs, "videos": vids, "messages": msgs, "prompt_text": text,
                             "video_grid_thw": inputs["video_grid_thw"].tolist(),
                             "image_grid_thw": inputs["image_grid_thw"].tolist() if imgs else [],
                             "prompt_ids": ids, "greedy_ids": greedy, "greedy_text": tok.decode(greedy),
                             "expanded_text_head": full[:400]})
        print(f"{name}: video grids {inputs['video_grid_thw'].tolist()} prompt {len(ids)} greedy {greedy}")
        print("   ", full[:300].replace("<|video_pad|>", "V"))
    json.dump(exp, open(os.path.join(out, "expected.json"), "w"), indent=1)


if len(sys.argv) > 1 and sys.argv[1] == "--e2e-video":
    torch.set_grad_enabled(False)
    here = os.path.dirname(os.path.abspath(__file__))
    a = sys.argv[2:]
    e2e_video(a[0] if a else os.path.join(here, "..", "..", "shared", "fixtures"),
              a[1] if len(a) > 1 else os.path.join(here, "..", "tests", "fixtures", "qwen3_5_vision", "e2e_video"))
    sys.exit(0)
if len(sys.argv) > 1 and sys.argv[1] == "--e2e":
    torch.set_grad_enabled(False)
    here = os.path.dirname(os.path.abspath(__file__))
    a = sys.argv[2:]
    e2e(a[0] if a else os.path.join(here, "..", "..", "shared", "fixtures"),
        a[1] if len(a) > 1 else os.path.join(here, "..", "tests", "fixtures", "qwen3_5_vision", "e2e"))
    sys.exit(0)
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
