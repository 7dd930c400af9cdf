"""Image prompts and the server's caches (bench/notes/vision_cache.md): the tiny Qwen3.5 fixture
with the e2e config and template but the published processor settings (a 448x448 image is 196
visual tokens), anna-serve on 2 threads.
  part 1: one image asked 4 times with max_tokens 1: encoder cache off / on (no prefix cache) / both.
  part 2: a two-turn chat about an image (turn 2 repeats turn 1 with its answer): turn-2 latency
          without and with the prompt cache (the image's blocks keyed by its content).
Run from the repository root after building anna-serve:
  python3 bench/vision_cache.py [BUILD_DIR]"""
import base64, io, os, sys, time, struct, zlib, random, json
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
os.environ["ANNA_SERVE_BIN"] = os.path.join(BUILD, "src", "cli", "anna-serve")
import tempfile
from conftest import FIXTURES
MODEL = tempfile.mkdtemp()
E2E = os.path.join(ROOT, "tests", "fixtures", "qwen3_5_vision", "e2e")
for f in ("config.json", "chat_template.jinja"):
    os.symlink(os.path.join(E2E, f), os.path.join(MODEL, f))
for f in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
    os.symlink(os.path.join(FIXTURES, "qwen3_5", f), os.path.join(MODEL, f))
from conftest import start_server
def png(seed, w, h):
    rnd = random.Random(seed)
    rows = b"".join(b"\0" + bytes(rnd.getrandbits(8) for _ in range(3 * w)) for _ in range(h))
    ch = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + ch(b"IDAT", zlib.compress(rows)) + ch(b"IEND", b"")
img = "data:image/png;base64," + base64.b64encode(png(1, 448, 448)).decode()
msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": img}}, {"type": "text", "text": "Describe this picture in detail."}]}]
for args in (["--no-prompt-cache", "--mm-cache-mib", "0"], ["--no-prompt-cache"], []):
    s = start_server(MODEL, "--ctx-size", "1024", "--threads", "2", *args)
    cl = s.client(); mid = cl.models.list().data[0].id
    ts = []
    for i in range(4):
        t = time.time(); r = cl.chat.completions.create(model=mid, messages=msgs, max_tokens=1, temperature=0); ts.append(time.time() - t)
    print(args or ["prefix cache + encoder cache (defaults)"], "prompt", r.usage.prompt_tokens, "first %.1f ms, repeats %s ms" % (ts[0]*1e3, " ".join("%.1f" % (x*1e3) for x in ts[1:])))
    s.stop()
import urllib.request
def met(s):
    return {l.split()[0]: float(l.split()[1]) for l in urllib.request.urlopen(s.url + "/metrics").read().decode().splitlines() if l.startswith(("anna_prefix_cache_hit_tokens_total", "anna_mm_tower_runs_total"))}
for args in (["--no-prompt-cache"], []):
    s = start_server(MODEL, "--ctx-size", "1024", "--threads", "2", *args)
    cl = s.client(); mid = cl.models.list().data[0].id
    t2 = []
    for k in range(3):
        im = "data:image/png;base64," + base64.b64encode(png(10 + k, 448, 448)).decode()
        m1 = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": im}}, {"type": "text", "text": "Describe this picture in detail."}]}]
        r1 = cl.chat.completions.create(model=mid, messages=m1, max_tokens=8, temperature=0)
        s.wait_idle()
        m2 = m1 + [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": "And what colours does it have?"}]
        t = time.time(); r2 = cl.chat.completions.create(model=mid, messages=m2, max_tokens=1, temperature=0); t2.append(time.time() - t)
        s.wait_idle(); print("   hit tokens so far", met(s)["anna_prefix_cache_hit_tokens_total"])
    print(args or ["prompt cache on (default)"], "turn-2 prompt", r2.usage.prompt_tokens, "turn-2 latency ms", " ".join("%.1f" % (x * 1e3) for x in t2), met(s))
    s.stop()
