# Builds tests/fixtures/mmproj/qwen3_5.mmproj.gguf: the vision tower of the tiny random
# `shared/fixtures/qwen3_5` checkpoint as a llama.cpp mmproj GGUF, written by llama.cpp's own
# converter (convert_hf_to_gguf.py --mmproj, class Qwen3VLVisionModel, projector type
# "qwen3vl_merger"), so anna's loader (src/model/vision_qwen35.c) reads the real names, layouts
# and metadata: v.patch_embd.weight / .weight.1 (the Conv3d split per temporal slot),
# v.position_embd, v.blk.N.{ln1,ln2,attn_qkv,attn_out,ffn_up,ffn_down}, v.post_ln, mm.0, mm.2.
#
#   ~/.cache/anna/venvs/hf/bin/python tools/mkfix_mmproj.py [LLAMA_CPP_DIR [FIXTURES_DIR [OUT]]]
#   defaults: the llama.cpp tree vendored in llama-cpp-python 0.3.36 under ~/.cache/anna/llama.cpp,
#   ../shared/fixtures, tests/fixtures/mmproj/qwen3_5.mmproj.gguf
#
# The converter reads image_mean / image_std from preprocessor_config.json, which the shared
# fixture lacks: the model folder is assembled in a temporary directory from the shared files
# plus tests/fixtures/qwen3_5_vision/e2e/preprocessor_config.json (mean = std = 0.5, the
# published values). --outtype f32 keeps the tower's weights exact (1.6 MB), so the tower rows
# match the HF folder's to float rounding. --model-name keeps general.name from naming the
# temporary directory.
#
# One addition to the converter's output: its Qwen3-VL class writes no min / max pixels (clip.cpp
# then uses its own token limits), so the file is copied by gguf-py's gguf_new_metadata with
# llama.cpp's keys clip.vision.image_min_pixels / image_max_pixels (KEY_IMAGE_MIN_PIXELS /
# KEY_IMAGE_MAX_PIXELS, u32, as the converter writes them for other projectors) set to the e2e
# processor's 1024 / 16384, so a GGUF text model + this mmproj preprocesses images as the e2e
# HF folder does (same grids, same prompt ids). Tensors and the other keys are untouched.
import glob, os, shutil, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
lc = sys.argv[1] if len(sys.argv) > 1 else glob.glob(
    os.path.expanduser("~/.cache/anna/llama.cpp/src/llama_cpp_python-*/vendor/llama.cpp"))[0]
fix = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "..", "shared", "fixtures")
out = sys.argv[3] if len(sys.argv) > 3 else os.path.join(root, "tests", "fixtures", "mmproj", "qwen3_5.mmproj.gguf")

with tempfile.TemporaryDirectory() as td:
    src = os.path.join(fix, "qwen3_5")
    for f in os.listdir(src):
        os.symlink(os.path.abspath(os.path.join(src, f)), os.path.join(td, f))
    shutil.copy(os.path.join(root, "tests", "fixtures", "qwen3_5_vision", "e2e", "preprocessor_config.json"),
                os.path.join(td, "preprocessor_config.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.path.join(lc, "gguf-py"))
    raw = os.path.join(td, "raw.mmproj.gguf")
    subprocess.run([sys.executable, os.path.join(lc, "convert_hf_to_gguf.py"), td, "--mmproj", "--outtype", "f32",
                    "--model-name", "qwen3_5-fixture", "--outfile", raw], check=True, env=env)
    sys.path.insert(0, os.path.join(lc, "gguf-py"))
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    reader = gguf.GGUFReader(raw, "r")
    writer = gguf.GGUFWriter(out, arch=reader.fields[gguf.Keys.General.ARCHITECTURE].contents(),
                             endianess=reader.endianess)
    u32 = gguf.GGUFValueType.UINT32
    copy_with_new_metadata(reader, writer, {gguf.Keys.ClipVision.IMAGE_MIN_PIXELS: MetadataDetails(u32, 1024),
                                            gguf.Keys.ClipVision.IMAGE_MAX_PIXELS: MetadataDetails(u32, 16384)}, [])
print("wrote", out, os.path.getsize(out), "bytes")
