#!/usr/bin/env python3
"""mkfix_vimg.py: image-decoding and Qwen3.5 image-processor fixtures for tests/media/test_image.

Run in a venv with torch, torchvision, transformers 5.25, pillow and numpy:
    ~/.cache/anna/venvs/hf/bin/python tools/mkfix_vimg.py [out_dir]
(default out_dir tests/fixtures/vision_pre). Writes, per case, the encoded image, PIL's RGB
(transformers' convert_to_rgb: alpha over white) as raw uint8, and the real
Qwen2VLImageProcessor (torchvision backend, the default) output: pixel_values as raw
little-endian f32 [n_patches, 3, 16, 16] (the t = 0 half of each [3, 2, 16, 16] patch vector;
the tool asserts the t = 1 half is identical) and grid_thw, listed in cases.json. The processor is built from the published
Qwen3.5 preprocessor_config.json values quoted below, with smaller pixel limits so that the
stored outputs stay small; `grids` records grid_thw under the unmodified published values.
bad/ holds crafted bad inputs (headers claiming 50000 x 50000 pixels, zero size, aspect > 200).
"""
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
import torch
import transformers
from PIL import Image
from transformers import Qwen2VLImageProcessor

# Qwen/Qwen3.5-* preprocessor_config.json as published (image processor part).
PUBLISHED = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
# The fixture config: the same with pixel limits of 8..24 patches (outputs stay small).
FIXTURE = dict(PUBLISHED, size={"longest_edge": 32 * 32 * 6, "shortest_edge": 32 * 32 * 2})

rng = np.random.default_rng(1234)


def scene(w, h, seed):
    """A smooth colour field with edges, text-like strokes and a little noise: enough structure
    for JPEG and the resampler, nothing that compresses to nothing."""
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        fx, fy, ph = r.uniform(0.02, 0.2), r.uniform(0.02, 0.2), r.uniform(0, 6.3)
        img[..., c] = 128 + 90 * np.sin(fx * x + ph) * np.cos(fy * y - ph)
    for _ in range(4):
        x0, y0 = r.integers(0, w), r.integers(0, h)
        x1, y1 = x0 + r.integers(2, max(3, w // 2)), y0 + r.integers(2, max(3, h // 2))
        img[y0:y1, x0:x1] = r.integers(0, 256, 3)
    img += r.normal(0, 6, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def png_chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def png_raw(w, h, depth, ctype, rows_bytes, extra=b""):
    """A PNG from raw scanlines (filter 0), for layouts PIL cannot write (16-bit RGB)."""
    raw = b"".join(b"\0" + r for r in rows_bytes)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra +
            png_chunk(b"IDAT", zlib.compress(raw)) + png_chunk(b"IEND", b""))


def enc(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def make_cases():
    c = []
    c.append(("jpeg_rgb_97x61", "jpg", enc(Image.fromarray(scene(97, 61, 1)), "JPEG", quality=90)))
    c.append(("jpeg_prog_150x100", "jpg",
              enc(Image.fromarray(scene(150, 100, 2)), "JPEG", quality=85, progressive=True)))
    c.append(("jpeg_444_64x70", "jpg",
              enc(Image.fromarray(scene(64, 70, 3)), "JPEG", quality=95, subsampling=0)))
    c.append(("jpeg_gray_64x80", "jpg",
              enc(Image.fromarray(scene(64, 80, 4)).convert("L"), "JPEG", quality=90)))
    c.append(("jpeg_down_400x300", "jpg", enc(Image.fromarray(scene(400, 300, 5)), "JPEG", quality=90)))
    c.append(("png_rgb_123x45", "png", enc(Image.fromarray(scene(123, 45, 6)), "PNG")))
    c.append(("png_rgb_64x64", "png", enc(Image.fromarray(scene(64, 64, 7)), "PNG")))
    c.append(("png_rgb_20x600", "png", enc(Image.fromarray(scene(20, 600, 8)), "PNG")))
    a = scene(70, 70, 9)
    alpha = np.tile(np.linspace(0, 255, 70).astype(np.uint8), (70, 1))
    alpha[:10] = 0
    c.append(("png_rgba_70x70", "png", enc(Image.fromarray(np.dstack([a, alpha]), "RGBA"), "PNG")))
    p = Image.fromarray(scene(50, 90, 10)).quantize(colors=40, dither=Image.Dither.NONE)
    c.append(("png_palette_trns_50x90", "png", enc(p, "PNG", transparency=3)))
    g = (scene(40, 40, 11)[..., 0] > 128)
    c.append(("png_gray1_40x40", "png", enc(Image.fromarray(g).convert("1"), "PNG")))
    la = np.dstack([scene(33, 47, 12)[..., 1], np.tile(np.arange(0, 255, 255 / 33).astype(np.uint8)[:33], (47, 1))])
    c.append(("png_la_33x47", "png", enc(Image.fromarray(la, "LA"), "PNG")))
    rgb16 = scene(48, 32, 13).astype(np.uint16) * 257 + rng.integers(0, 256, (32, 48, 3)).astype(np.uint16)
    c.append(("png_rgb16_48x32", "png",
              png_raw(48, 32, 16, 2, [r.astype(">u2").tobytes() for r in rgb16])))
    g16 = rng.integers(0, 600, (32, 36)).astype(np.uint16)
    c.append(("png_gray16_36x32", "png", png_raw(36, 32, 16, 0, [r.astype(">u2").tobytes() for r in g16])))
    rgbt = scene(40, 36, 14)
    rgbt[5:15, 5:15] = (10, 20, 30)
    c.append(("png_rgb_trns_40x36", "png", enc(Image.fromarray(rgbt), "PNG", transparency=(10, 20, 30))))
    c.append(("webp_lossy_80x60", "webp", enc(Image.fromarray(scene(80, 60, 15)), "WEBP", quality=80)))
    wa = np.dstack([scene(50, 50, 16), np.tile(np.linspace(255, 0, 50).astype(np.uint8), (50, 1))])
    c.append(("webp_lossless_rgba_50x50", "webp", enc(Image.fromarray(wa, "RGBA"), "WEBP", lossless=True)))
    c.append(("webp_lossy_rgba_50x50", "webp", enc(Image.fromarray(wa, "RGBA"), "WEBP", quality=70)))
    gp = Image.fromarray(scene(64, 48, 17)).quantize(colors=64, dither=Image.Dither.NONE)
    c.append(("gif_trns_64x48", "gif", enc(gp, "GIF", transparency=5)))
    gp2 = Image.fromarray(scene(45, 70, 18)).quantize(colors=200, dither=Image.Dither.NONE)
    c.append(("gif_interlace_45x70", "gif", enc(gp2, "GIF", interlace=True)))
    return c


def bad_inputs():
    b = {}
    ihdr = struct.pack(">IIBBBBB", 50000, 50000, 8, 2, 0, 0, 0)
    b["png_huge.png"] = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) +
                         png_chunk(b"IDAT", zlib.compress(b"\0" * 64)) + png_chunk(b"IEND", b""))
    ihdr0 = struct.pack(">IIBBBBB", 0, 10, 8, 2, 0, 0, 0)
    b["png_zero.png"] = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr0) +
                         png_chunk(b"IDAT", zlib.compress(b"\0" * 4)) + png_chunk(b"IEND", b""))
    j = bytearray(enc(Image.fromarray(scene(16, 16, 20)), "JPEG", quality=90))
    k = j.index(b"\xff\xc0")  # baseline SOF0: length(2) precision(1) height(2) width(2)
    j[k + 5:k + 9] = struct.pack(">HH", 50000, 50000)
    b["jpeg_huge.jpg"] = bytes(j)
    g = bytearray(enc(Image.fromarray(scene(16, 16, 21)).quantize(colors=16), "GIF"))
    g[6:10] = struct.pack("<HH", 50000, 50000)
    b["gif_huge.gif"] = bytes(g)
    # WebP cannot state 50000 (VP8L: 14-bit width-1 and height-1 after the 0x2f signature);
    # its largest, 16384 x 16384, is far over the limit too.
    bits = (16384 - 1) | ((16384 - 1) << 14)
    vp8l = b"\x2f" + struct.pack("<I", bits) + b"\0" * 16
    b["webp_huge_16384.webp"] = b"RIFF" + struct.pack("<I", 4 + 8 + len(vp8l)) + b"WEBPVP8L" + \
        struct.pack("<I", len(vp8l)) + vp8l
    b["png_aspect_402x2.png"] = enc(Image.fromarray(scene(402, 2, 22)), "PNG")
    return b


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/vision_pre"
    os.makedirs(os.path.join(out, "bad"), exist_ok=True)
    assert torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"), "torch's uint8 AVX path expected"
    proc = Qwen2VLImageProcessor(**{k: v for k, v in FIXTURE.items() if k not in ("processor_class", "image_processor_type")})
    pub = Qwen2VLImageProcessor(**{k: v for k, v in PUBLISHED.items() if k not in ("processor_class", "image_processor_type")})
    assert proc.backend == "torchvision", proc.backend
    with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
        json.dump(FIXTURE, f, indent=2)
    cases = []
    for name, ext, data in make_cases():
        fn = f"{name}.{ext}"
        with open(os.path.join(out, fn), "wb") as f:
            f.write(data)
        im = Image.open(io.BytesIO(data))
        mode = im.mode
        rgb = transformers.image_transforms.convert_to_rgb(im, return_numpy=True)
        assert rgb.dtype == np.uint8 and rgb.shape[2] == 3
        rgb.tofile(os.path.join(out, f"{name}.rgb"))
        r = proc(images=Image.open(io.BytesIO(data)), return_tensors="pt")
        pv = r["pixel_values"].numpy().astype("<f4")
        grid = r["image_grid_thw"][0].tolist()
        # The processor repeats the image over the 2 temporal slots of each patch vector
        # (channel, t, y, x); checked here, then only t = 0 is stored (half the bytes).
        p5 = pv.reshape(pv.shape[0], 3, 2, 16, 16)
        assert np.array_equal(p5[:, :, 0], p5[:, :, 1])
        np.ascontiguousarray(p5[:, :, 0]).tofile(os.path.join(out, f"{name}.f32"))
        cases.append({"name": name, "file": fn, "pil_mode": mode, "width": im.width, "height": im.height,
                      "pixel_values_shape": list(pv.shape), "stored_shape": [pv.shape[0], 3, 16, 16], "grid_thw": grid})
        print(f"{name:28s} {mode:5s} {im.width}x{im.height} -> grid {grid}, {pv.nbytes // 2} bytes")
    grids = []
    for (w, h) in [(448, 448), (1024, 1024), (1000, 700), (30, 40), (5000, 4000), (4000, 20), (250, 12000)]:
        im = Image.fromarray(np.zeros((h, w, 3), np.uint8))
        g = pub(images=im, return_tensors="pt")["image_grid_thw"][0].tolist()
        grids.append({"width": w, "height": h, "grid_thw": g})
    for fn, data in bad_inputs().items():
        with open(os.path.join(out, "bad", fn), "wb") as f:
            f.write(data)
    meta = {"generator": "tools/mkfix_vimg.py", "transformers": transformers.__version__,
            "torch": torch.__version__, "pillow": Image.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "published_config": PUBLISHED, "cases": cases, "grids_published_config": grids}
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
