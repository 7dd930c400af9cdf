"""anna-pull and --hf-repo against a local Hub (hubmock.py): cache layout shared with
huggingface_hub, checksums, resume, tokens, offline. Needs ANNA_BIN_DIR (the built CLIs) and
ANNA_FIXTURES; huggingface_hub from scripts/requirements-test.txt."""

import hashlib
import json
import os
import subprocess

import pytest

from hubmock import TOKEN, fixture_hub

BIN = os.environ.get("ANNA_BIN_DIR", "build/src/cli")
FIX = os.environ.get("ANNA_FIXTURES", os.path.join(os.path.dirname(__file__), "../../../shared/fixtures"))


@pytest.fixture
def hub():
    h = fixture_hub(FIX).start()
    yield h
    h.stop()


@pytest.fixture
def env(hub, tmp_path):
    """A clean environment: the mock as HF_ENDPOINT, HF_HOME in tmp (no token anywhere)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    e["HF_ENDPOINT"] = hub.endpoint
    e["HF_HOME"] = str(tmp_path / "hfhome")
    return e


def cache(env):
    return os.path.join(env["HF_HOME"], "hub")


def pull(env, *args, ok=True):
    p = subprocess.run([os.path.join(BIN, "anna-pull"), "--no-progress", *args], env=env, capture_output=True,
                       text=True, timeout=120)
    assert "Sanitizer" not in p.stderr, p.stderr  # an ASan build: failures must be clean too
    if ok:
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().splitlines()[-1]
    assert p.returncode != 0, p.stdout
    return p.stderr


def test_single_file_layout(hub, env):
    path = pull(env, "anna-test/tiny-gguf:tiny-q8_0.gguf")
    data = hub.repos["anna-test/tiny-gguf"].files["tiny-q8_0.gguf"]
    sha = hashlib.sha256(data).hexdigest()
    repo_dir = os.path.join(cache(env), "models--anna-test--tiny-gguf")
    assert path == os.path.join(repo_dir, "snapshots", "2" * 40, "tiny-q8_0.gguf")
    assert open(path, "rb").read() == data
    # huggingface_hub's layout: a relative link into blobs/, named by the sha256; refs/main.
    assert os.readlink(path) == "../../blobs/" + sha
    assert open(os.path.join(repo_dir, "refs", "main")).read() == "2" * 40
    assert not [f for f in os.listdir(os.path.join(repo_dir, "blobs")) if f.endswith(".incomplete")]
    # The bytes came from the CDN host, the metadata from the Hub; only the other file untouched.
    cdn = hub.requests(lambda r: r["path"].startswith("/cdn/"))
    assert len(cdn) == 1 and cdn[0]["host"].startswith("localhost")
    assert not hub.requests(lambda r: "tiny-q4_0" in r["path"])
    # A second pull downloads nothing.
    n = len(hub.requests(lambda r: r["path"].startswith("/cdn/")))
    assert pull(env, "anna-test/tiny-gguf:tiny-q8_0.gguf") == path
    assert len(hub.requests(lambda r: r["path"].startswith("/cdn/"))) == n


def test_folder(hub, env):
    path = pull(env, "anna-test/tiny-qwen2")
    files = hub.repos["anna-test/tiny-qwen2"].files
    got = sorted(os.listdir(path))
    assert got == sorted(["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                          "chat_template.jinja", "model.safetensors", "expected.json"])
    for f in got:
        assert open(os.path.join(path, f), "rb").read() == files[f], f
    # Small files are named by their git blob sha1 (the Hub's ETag), weights by sha256.
    assert os.readlink(os.path.join(path, "config.json")).endswith(
        hashlib.sha1(b"blob %d\0" % len(files["config.json"]) + files["config.json"]).hexdigest())
    assert os.readlink(os.path.join(path, "model.safetensors")).endswith(
        hashlib.sha256(files["model.safetensors"]).hexdigest())


def test_gguf_repo_without_file_names_the_files(env):
    err = pull(env, "anna-test/tiny-gguf", ok=False)
    assert "no GGUF file for 'Q4_K_M'" in err and "tiny-q8_0.gguf" in err and "tiny-q4_0.gguf" in err


def test_quant_tags(hub, env):
    """ORG/NAME:TAG picks the GGUF of that quantization (llama.cpp's -hf), ORG/NAME alone the
    Q4_K_M one; whole fields only, never the vision projector, offline from the snapshot."""
    files = hub.repos["anna-test/multi-gguf"].files
    for tag, want in (("q8_0", "Multi-0.5B-Q8_0.gguf"), ("Q4_K_M", "Multi-0.5B-Q4_K_M.gguf"),
                      ("Q4_K", "Multi-0.5B-Q4_K.gguf")):
        path = pull(env, "anna-test/multi-gguf:" + tag)
        assert path.endswith("/" + want) and open(path, "rb").read() == files[want], tag
    assert pull(env, "anna-test/multi-gguf").endswith("/Multi-0.5B-Q4_K_M.gguf")
    assert "2 GGUF files match 'F16'" in pull(env, "anna-test/multi-gguf:F16", ok=False)
    err = pull(env, "anna-test/multi-gguf:Q5_K_M", ok=False)
    assert "no GGUF file for 'Q5_K_M'" in err and "Multi-0.5B-Q8_0.gguf" in err
    n = len(hub.log)
    off = dict(env, HF_HUB_OFFLINE="1")
    assert pull(off, "anna-test/multi-gguf:Q8_0").endswith("/Multi-0.5B-Q8_0.gguf")
    assert pull(off, "anna-test/multi-gguf").endswith("/Multi-0.5B-Q4_K_M.gguf")
    assert len(hub.log) == n
    assert not hub.requests(lambda r: "mmproj" in r["path"])


def test_offline(hub, env):
    e = dict(env, HF_HUB_OFFLINE="1")
    err = pull(e, "anna-test/tiny-gguf:tiny-q8_0.gguf", ok=False)
    assert "not in the Hub cache" in err
    assert not hub.log, "offline must not touch the network"
    path = pull(env, "anna-test/tiny-gguf:tiny-q8_0.gguf")
    folder = pull(env, "anna-test/tiny-qwen2")
    n = len(hub.log)
    assert pull(e, "anna-test/tiny-gguf:tiny-q8_0.gguf") == path
    assert pull(e, "anna-test/tiny-qwen2") == folder
    assert pull(env, "--offline", "anna-test/tiny-qwen2") == folder
    assert len(hub.log) == n


def test_gated_needs_token(hub, env, tmp_path):
    err = pull(env, "anna-test/gated:weights.gguf", ok=False)
    assert "401" in err and "HF_TOKEN" in err
    err = pull(dict(env, HF_TOKEN="hf_wrong"), "anna-test/gated:weights.gguf", ok=False)
    assert "403" in err and "refused" in err
    path = pull(dict(env, HF_TOKEN=TOKEN), "anna-test/gated:weights.gguf")
    assert open(path, "rb").read() == hub.repos["anna-test/gated"].files["weights.gguf"]
    # The token went to the Hub, never to the CDN (another host).
    assert any(r["auth"] == f"Bearer {TOKEN}" for r in hub.requests(lambda r: "/resolve/" in r["path"]))
    assert all(r["auth"] is None for r in hub.requests(lambda r: r["path"].startswith("/cdn/")))
    # The token file huggingface_hub's login writes (HF_HOME/token), and the older variable.
    os.makedirs(env["HF_HOME"], exist_ok=True)
    with open(os.path.join(env["HF_HOME"], "token"), "w") as f:
        f.write(TOKEN + "\n")
    assert pull(env, "anna-test/gated:config.json").endswith("3" * 40 + "/config.json")
    os.remove(os.path.join(env["HF_HOME"], "token"))
    e = dict(env, HUGGING_FACE_HUB_TOKEN=TOKEN, HF_HOME=str(tmp_path / "other"))
    assert open(pull(e, "anna-test/gated:config.json"), "rb").read() == b'{"gated": true}\n'


def test_checksum_mismatch_fails(env):
    err = pull(env, "anna-test/corrupt:model.gguf", ok=False)
    assert "checksum mismatch" in err and "model.gguf" in err
    blobs = os.path.join(cache(env), "models--anna-test--corrupt", "blobs")
    assert os.listdir(blobs) == [], "a corrupt download must not stay in the cache"
    assert not os.path.exists(os.path.join(cache(env), "models--anna-test--corrupt", "snapshots", "4" * 40,
                                           "model.gguf"))


def test_interrupted_download_resumes_next_run(hub, env):
    data = hub.repos["anna-test/cut"].files["model.gguf"]
    err = pull(env, "--retries", "0", "anna-test/cut:model.gguf", ok=False)
    assert "resumes on the next run" in err
    blobs = os.path.join(cache(env), "models--anna-test--cut", "blobs")
    part = [f for f in os.listdir(blobs) if f.endswith(".incomplete")]
    assert len(part) == 1
    have = os.path.getsize(os.path.join(blobs, part[0]))
    assert 0 < have < len(data)
    path = pull(env, "--retries", "0", "anna-test/cut:model.gguf")
    assert open(path, "rb").read() == data
    cdn = hub.requests(lambda r: r["path"].startswith("/cdn/"))
    assert [r["range"] for r in cdn] == [None, f"bytes={have}-"]


def test_interrupted_download_retries_in_one_run(hub, env):
    data = hub.repos["anna-test/cut-twice"].files["model.gguf"]
    path = pull(env, "anna-test/cut-twice:model.gguf")
    assert open(path, "rb").read() == data
    ranges = [r["range"] for r in hub.requests(lambda r: r["path"].startswith("/cdn/"))]
    assert ranges[0] is None and ranges[-1] is not None and len(ranges) >= 2


def test_not_found_and_bad_names(env):
    assert "404" in pull(env, "anna-test/tiny-gguf:nope.gguf", ok=False)
    assert "404" in pull(env, "anna-test/no-such-repo:x.gguf", ok=False)
    assert "404" in pull(env, "--revision", "v9", "anna-test/tiny-gguf:tiny-q4_0.gguf", ok=False)
    for bad in ("noslash", "a/b/c", "org/name:../../etc/passwd", "org/na me", "-x/y", "org/name:/abs"):
        err = pull(env, bad, ok=False)
        assert "ORG/NAME" in err or "repo id" in err or "relative path" in err, (bad, err)


def test_renamed_repo_redirect(hub, env):
    path = pull(env, "anna-test/old-gguf:tiny-q4_0.gguf")
    assert "models--anna-test--old-gguf/snapshots/" + "2" * 40 in path
    assert open(path, "rb").read() == hub.repos["anna-test/tiny-gguf"].files["tiny-q4_0.gguf"]


def test_revision_by_commit(hub, env):
    path = pull(env, "--revision", "2" * 40, "anna-test/tiny-gguf:tiny-q4_0.gguf")
    assert path.endswith("snapshots/" + "2" * 40 + "/tiny-q4_0.gguf")
    assert not os.path.exists(os.path.join(cache(env), "models--anna-test--tiny-gguf", "refs", "main"))


def test_huggingface_hub_shares_the_cache(hub, env, monkeypatch):
    """anna's downloads are huggingface_hub cache hits, and the other way round."""
    import huggingface_hub

    path = pull(env, "anna-test/tiny-gguf:tiny-q8_0.gguf")
    got = huggingface_hub.hf_hub_download("anna-test/tiny-gguf", "tiny-q8_0.gguf", cache_dir=cache(env),
                                          local_files_only=True)
    assert os.path.realpath(got) == os.path.realpath(path) and got == path
    # huggingface_hub downloading from the mock (the mock is faithful enough for it), then anna
    # offline finds that file where huggingface_hub put it.
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    other = os.path.join(env["HF_HOME"], "pyhub")
    py = subprocess.run(["python3", "-c", "import huggingface_hub,sys; print(huggingface_hub.hf_hub_download("
                         "'anna-test/tiny-gguf','tiny-q4_0.gguf',cache_dir=sys.argv[1]))", other],
                        env=dict(env, HF_HUB_DISABLE_XET="1"), capture_output=True, text=True, timeout=120)
    assert py.returncode == 0, py.stderr
    mine = pull(dict(env, HF_HUB_OFFLINE="1", HF_HUB_CACHE=other), "anna-test/tiny-gguf:tiny-q4_0.gguf")
    assert mine == py.stdout.strip().splitlines()[-1]


def run_cli(args, env):
    p = subprocess.run([os.path.join(BIN, args[0]), *args[1:]], env=env, capture_output=True, text=True,
                       timeout=300)
    assert "Sanitizer" not in p.stderr, p.stderr
    return p


def test_hf_repo_flag_loads_the_model(env):
    """--hf-repo on anna-generate: the same tokens as --model-dir on the fixture folder."""
    local = run_cli(["anna-generate", "--model-dir", os.path.join(FIX, "qwen2"), "--prompt-ids", "1,2,3",
                     "--max-new-tokens", "4", "--quiet"], env)
    assert local.returncode == 0, local.stderr
    remote = run_cli(["anna-generate", "--hf-repo", "anna-test/tiny-qwen2", "--prompt-ids", "1,2,3",
                      "--max-new-tokens", "4", "--quiet"], env)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout
    both = run_cli(["anna-generate", "--hf-repo", "anna-test/tiny-qwen2", "--model", "x", "--prompt-ids", "1"], env)
    assert both.returncode != 0 and "not both" in both.stderr
    tok = run_cli(["anna-tokenize", "--hf-repo", "anna-test/tiny-qwen2", "--text", "hello world"], env)
    ref = run_cli(["anna-tokenize", "--model-dir", os.path.join(FIX, "qwen2"), "--text", "hello world"], env)
    assert tok.returncode == 0 and tok.stdout == ref.stdout, tok.stderr


def test_hf_repo_on_the_other_clis(env):
    """anna-gguf and anna-template (and the GGUF loader through anna-generate) on Hub names."""
    local = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "gguf", "qwen2.gguf")
    a = run_cli(["anna-gguf", "--hf-repo", "anna-test/qwen2-gguf:qwen2.gguf"], env)
    b = run_cli(["anna-gguf", local], env)
    assert a.returncode == 0 and a.stdout == b.stdout, a.stderr
    g1 = run_cli(["anna-generate", "--hf-repo", "anna-test/qwen2-gguf:qwen2.gguf", "--prompt-ids", "1,2,3",
                  "--max-new-tokens", "3", "--quiet"], env)
    g2 = run_cli(["anna-generate", "--model", local, "--prompt-ids", "1,2,3", "--max-new-tokens", "3", "--quiet"], env)
    assert g1.returncode == 0 and g1.stdout == g2.stdout, g1.stderr
    msgs = os.path.join(env["HF_HOME"], "m.json")
    with open(msgs, "w") as f:
        json.dump([{"role": "user", "content": "hi"}], f)
    t1 = run_cli(["anna-template", "--hf-repo", "anna-test/tiny-qwen2", "--messages", msgs], env)
    t2 = run_cli(["anna-template", "--model-dir", os.path.join(FIX, "qwen2"), "--messages", msgs], env)
    assert t1.returncode == 0 and t1.stdout == t2.stdout and t1.stdout, t1.stderr
    bad = run_cli(["anna-quantize", "--hf-repo", "anna-test/no-such"], env)
    assert bad.returncode == 1 and "404" in bad.stderr


def test_progress_bar_only_on_a_terminal(env):
    import pty

    m, s = pty.openpty()
    p = subprocess.Popen([os.path.join(BIN, "anna-pull"), "anna-test/tiny-gguf:tiny-q8_0.gguf"], env=env,
                         stdout=subprocess.PIPE, stderr=s)
    out = p.stdout.read()
    assert p.wait(timeout=120) == 0
    os.close(s)
    tty = b""
    while True:
        try:
            d = os.read(m, 65536)
        except OSError:
            break
        if not d:
            break
        tty += d
    os.close(m)
    assert b"tiny-q8_0.gguf" in out
    assert b"[" + b"#" * 30 + b"] 100%" in tty and b"\r" in tty
    # Not a terminal: one plain line per file, no bar.
    err = subprocess.run([os.path.join(BIN, "anna-pull"), "anna-test/tiny-gguf:tiny-q4_0.gguf"], env=env,
                         capture_output=True, text=True, timeout=120).stderr
    assert "downloading tiny-q4_0.gguf" in err and "#" not in err


def test_serve_hf_repo(env):
    """anna-serve --hf-repo: loads the Hub folder and lists the Hub name as the model id."""
    import re
    import time
    import urllib.request

    serve = os.path.join(BIN, "anna-serve")
    if not os.path.exists(serve):
        pytest.fail("anna-serve not built (libmicrohttpd missing?)")
    p = subprocess.Popen([serve, "--hf-repo", "anna-test/tiny-qwen2", "--port", "0", "--threads", "1"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port, seen = None, []
        deadline = time.time() + 60
        while port is None and time.time() < deadline:
            ln = p.stdout.readline()
            if not ln:
                break
            seen.append(ln)
            m = re.search(r"listening on http://[^:]+:(\d+)", ln)
            port = int(m.group(1)) if m else None
        assert port, "".join(seen)
        models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30))
        assert [d["id"] for d in models["data"]] == ["anna-test/tiny-qwen2"]
    finally:
        p.terminate()
        p.wait(timeout=30)
