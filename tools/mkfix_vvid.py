#!/usr/bin/env python3
"""mkfix_vvid.py: video-decoding and Qwen3.5 video-processor fixtures for tests/media/test_video.

transformers 5.25 decodes a video file path with torchcodec (Qwen3VLVideoProcessor.fetch_videos:
backend "torchcodec", seek_mode "exact"; the torchvision fallback no longer exists in
torchvision >= 0.26), so the reference needs torchcodec on top of the hf venv, and torchcodec
needs the system FFmpeg libraries (Debian 12: libavdevice59 libavfilter8 besides the
libav*-dev packages scripts/setup.sh installs). One way, without touching the hf venv:
    python3 -m venv ~/.cache/anna/venvs/vvid
    ~/.cache/anna/venvs/vvid/bin/pip install torchcodec==0.17.0
    echo ~/.cache/anna/venvs/hf/lib/python3.11/site-packages \
        > ~/.cache/anna/venvs/vvid/lib/python3.11/site-packages/hf.pth
    ~/.cache/anna/venvs/vvid/bin/python tools/mkfix_vvid.py [out_dir]
(default out_dir tests/fixtures/vision_video).

Writes short synthetic clips encoded with PyAV (moving gradients and a moving block, so every
frame differs and the choice of frames matters), and for each, from the real processor
(Qwen3VLVideoProcessor with the published video_preprocessor_config.json values below and a
smaller pixel budget so the outputs stay small):
  <name>.rgb   torchcodec's RGB24 of the sampled frames, [n][h][w][3] uint8
  <name>.f32   pixel_values_videos, little-endian f32 [t*h*w, 1536]
and cases.json with the stream facts (total frames, fps), frame indices, per-group timestamps
(the Qwen3VLProcessor's _calculate_timestamps and its "<%.1f seconds>" text), grid_thw and
the grid under the unmodified published config with cap_pixels_per_frame False (the 5.25
default) and True. bad/ holds an audio-only file, a truncated clip and a corrupt clip.
"""
import json
import os
import sys
import warnings

import av
import numpy as np
import torch
import transformers
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

warnings.filterwarnings("ignore")

# Qwen/Qwen3.5-* video_preprocessor_config.json as published.
PUBLISHED = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "video_processor_type": "Qwen3VLVideoProcessor",
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
}
# Fixture budget: 4 frames of 64 x 64 px: the larger clips are scaled down.
FIXTURE = dict(PUBLISHED, size={"longest_edge": 4096 * 4, "shortest_edge": 4096})

# name, container, codec, w, h, fps, frames, extra codec-context settings
CLIPS = [
    # width a multiple of 32: torchcodec converts with swscale (flags 0)
    ("h264_96x64", "mp4", "libx264", 96, 64, 24, 60, {}),
    # width not a multiple of 32: torchcodec's filtergraph path
    ("vp9_80x60", "webm", "libvpx-vp9", 80, 60, 30, 90, {}),
    # MKV, BT.709 full-range tagged: the frame's matrix and range matter
    ("h264_bt709full_100x54", "mkv", "libx264", 100, 54, 25, 50,
     {"colorspace": 1, "color_range": 2}),
    # odd heights: libswscale's generic path (not the yuv2rgb fast path), where the flags of
    # each torchcodec path matter; 64 wide = swscale path, 81 wide = filtergraph path
    ("vp9_odd_64x45", "webm", "libvpx-vp9", 64, 45, 12, 30, {}),
    ("vp9_odd_81x61", "webm", "libvpx-vp9", 81, 61, 15, 40, {}),
    # display matrix in the MP4 track header (patched after muxing): torchcodec rotates
    ("h264_rot90_96x64", "mp4", "libx264", 96, 64, 24, 36, {"rotate": 90}),
    ("h264_rot180_80x48", "mp4", "libx264", 80, 48, 24, 30, {"rotate": 180}),
    # 3 frames only (n = 3, odd: the last frame repeats) and sides < 32 (scaled up first)
    ("h264_tiny_24x20", "mp4", "libx264", 24, 20, 10, 3, {}),
]


def frame_rgb(w, h, i):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    img[..., 0] = 128 + 100 * np.sin(0.11 * x + 0.23 * i)
    img[..., 1] = 128 + 100 * np.cos(0.13 * y - 0.17 * i)
    img[..., 2] = (x * 2.1 + y * 1.3 + i * 9) % 256
    bx, by = (i * 3) % max(1, w - 8), (i * 2) % max(1, h - 8)
    img[by:by + 8, bx:bx + 8] = (255, 40, 200)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def set_tkhd_rotation(path, deg):
    """Writes a rotation matrix into the first tkhd box (what phones write; the mov demuxer
    exports it as the stream's display matrix)."""
    import math
    import struct
    b = bytearray(open(path, "rb").read())
    i = b.find(b"tkhd")
    v = b[i + 4]
    # version/flags, creation+modification, track id, reserved, duration, reserved[8],
    # layer/alternate group/volume/reserved: then the 3x3 matrix
    off = i + 4 + 4 + (8 if v == 0 else 16) + 4 + 4 + (4 if v == 0 else 8) + 8 + 8
    c, s = round(math.cos(math.radians(deg))), round(math.sin(math.radians(deg)))
    b[off:off + 36] = struct.pack(">9i", c * 65536, s * 65536, 0, -s * 65536, c * 65536, 0,
                                  0, 0, 1 << 30)
    open(path, "wb").write(bytes(b))


def encode(path, fmt, codec, w, h, fps, frames, extra):
    extra = dict(extra)
    rotate = extra.pop("rotate", None)
    c = av.open(path, "w", format={"mp4": "mp4", "webm": "webm", "mkv": "matroska"}[fmt])
    s = c.add_stream(codec, rate=fps)
    s.width, s.height, s.pix_fmt = w, h, "yuv420p"
    opts = {"crf": "18"} if codec == "libx264" else {"crf": "20", "b": "0", "deadline": "good"}
    if codec == "libx264":
        opts["preset"] = "medium"
    s.codec_context.options = opts
    for k, v in extra.items():
        setattr(s.codec_context, k, v)
    for i in range(frames):
        f = av.VideoFrame.from_ndarray(frame_rgb(w, h, i), format="rgb24")
        if extra:
            f = f.reformat(format="yuv420p", dst_colorspace=extra.get("colorspace"),
                           dst_color_range=extra.get("color_range"))
        for p in s.encode(f):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()
    if rotate is not None:
        set_tkhd_rotation(path, rotate)


def run_processor(cfg, path, **kw):
    vp = Qwen3VLVideoProcessor(**{k: v for k, v in cfg.items()
                                  if k not in ("processor_class", "video_processor_type")})
    out = vp(videos=[path], return_metadata=True, return_tensors="pt", **kw)
    return out


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/vision_video"
    os.makedirs(os.path.join(out_dir, "bad"), exist_ok=True)
    from torchcodec.decoders import VideoDecoder
    import torchcodec
    cases = []
    for name, fmt, codec, w, h, fps, frames, extra in CLIPS:
        path = os.path.join(out_dir, f"{name}.{fmt}")
        encode(path, fmt, codec, w, h, fps, frames, extra)
        out = run_processor(FIXTURE, path, cap_pixels_per_frame=False)
        md = out["video_metadata"][0]
        idx = [int(i) for i in md.frames_indices]
        pv = out["pixel_values_videos"].float().numpy()
        grid = [int(x) for x in out["video_grid_thw"][0]]
        assert pv.shape == (grid[0] * grid[1] * grid[2], 1536), pv.shape
        pv.astype("<f4").tofile(os.path.join(out_dir, f"{name}.f32"))
        # torchcodec's RGB of the same frames (what the processor resized).
        dec = VideoDecoder(path, seek_mode="exact", num_ffmpeg_threads=0)
        rgb = dec.get_frames_at(indices=idx).data.permute(0, 2, 3, 1).contiguous().numpy()
        rgb.astype(np.uint8).tofile(os.path.join(out_dir, f"{name}.rgb"))
        ts = Qwen3VLProcessor._calculate_timestamps(None, list(idx), md.fps, 2)
        texts = [f"<{t:.1f} seconds>" for t in ts]
        pub = {}
        for cap in (False, True):
            o = run_processor(PUBLISHED, path, cap_pixels_per_frame=cap)
            pub["cap" if cap else "nocap"] = [int(x) for x in o["video_grid_thw"][0]]
        cases.append({
            "name": name, "file": os.path.basename(path), "codec": codec,
            "width": int(rgb.shape[2]), "height": int(rgb.shape[1]), "total_frames": int(md.total_num_frames),
            "fps": float(md.fps), "indices": idx, "rgb_shape": list(rgb.shape),
            "grid_thw": grid, "timestamps": ts, "timestamp_text": texts,
            "grid_published": pub,
        })
        print(name, md.total_num_frames, md.fps, idx, grid, texts, pub)

    # smart_resize under the published config for clip shapes no fixture video has, through
    # the processor's own resize (frames as a stride-0 expanded tensor, n = frame count).
    from transformers.image_utils import SizeDict
    resize_table = []
    for n, h, w in [(8, 1080, 1920), (4, 2160, 3840), (300, 720, 1280), (5, 20, 700),
                    (7, 16, 16), (768, 480, 640), (3, 4000, 30), (61, 360, 640), (2, 1, 64)]:
        vp = Qwen3VLVideoProcessor(**{k: v for k, v in PUBLISHED.items()
                                      if k not in ("processor_class", "video_processor_type")})
        row = {"n": n, "h": h, "w": w}
        for cap in (False, True):
            x = torch.zeros(1, 1, 3, h, w, dtype=torch.uint8).expand(1, n, 3, h, w)
            try:
                y = vp.resize(videos=x, size=SizeDict(**PUBLISHED["size"]), resample=vp.resample,
                              factor=32, temporal_factor=2, cap_pixels_per_frame=cap)
                row["cap" if cap else "nocap"] = [int(y.shape[-2]), int(y.shape[-1])]
            except ValueError as e:
                row["cap" if cap else "nocap"] = str(e)
        print(row)
        resize_table.append(row)

    # the published config as transformers serialises it (save_pretrained)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        Qwen3VLVideoProcessor(**{k: v for k, v in PUBLISHED.items()
                                 if k not in ("processor_class", "video_processor_type")}
                              ).save_pretrained(d)
        txt = open(os.path.join(d, "video_preprocessor_config.json")).read()
    open(os.path.join(out_dir, "video_preprocessor_config.json"), "w").write(txt)

    # bad inputs
    a = av.open(os.path.join(out_dir, "bad", "audio_only.mp4"), "w", format="mp4")
    s = a.add_stream("aac", rate=16000)
    for i in range(10):
        fr = av.AudioFrame.from_ndarray(
            (np.sin(np.arange(1024) * 0.05 + i) * 0.3).astype(np.float32)[None, :],
            format="fltp", layout="mono")
        fr.sample_rate = 16000
        fr.pts = i * 1024
        for p in s.encode(fr):
            a.mux(p)
    for p in s.encode():
        a.mux(p)
    a.close()
    raw = open(os.path.join(out_dir, "h264_96x64.mp4"), "rb").read()
    # the MP4 from PyAV has moov at the end: cutting it off leaves no index
    open(os.path.join(out_dir, "bad", "truncated.mp4"), "wb").write(raw[: len(raw) // 2])
    # moov first (faststart), mdat cut: the index promises frames the data lacks
    c = av.open(os.path.join(out_dir, "bad", "_fs.mp4"), "w", format="mp4",
                options={"movflags": "faststart"})
    s = c.add_stream("libx264", rate=24)
    s.width, s.height, s.pix_fmt = 64, 64, "yuv420p"
    for i in range(48):
        for p in s.encode(av.VideoFrame.from_ndarray(frame_rgb(64, 64, i), format="rgb24")):
            c.mux(p)
    for p in s.encode():
        c.mux(p)
    c.close()
    fs = open(os.path.join(out_dir, "bad", "_fs.mp4"), "rb").read()
    os.remove(os.path.join(out_dir, "bad", "_fs.mp4"))
    assert fs.find(b"moov") < fs.find(b"mdat"), "faststart did not move moov"
    open(os.path.join(out_dir, "bad", "truncated_faststart.mp4"), "wb").write(fs[: len(fs) * 3 // 5])
    web = bytearray(open(os.path.join(out_dir, "vp9_80x60.webm"), "rb").read())
    open(os.path.join(out_dir, "bad", "truncated.webm"), "wb").write(web[: len(web) * 2 // 3])
    r = np.random.default_rng(7)
    for k in r.integers(200, len(web), 64):
        web[k] = int(r.integers(0, 256))
    open(os.path.join(out_dir, "bad", "corrupt.webm"), "wb").write(bytes(web))
    meta = {
        "generator": "tools/mkfix_vvid.py",
        "transformers": transformers.__version__, "torch": torch.__version__,
        "torchcodec": torchcodec.__version__, "av": av.__version__,
        "published_config": PUBLISHED, "fixture_config": FIXTURE, "cases": cases,
        "resize_table": resize_table,
    }
    with open(os.path.join(out_dir, "cases.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
