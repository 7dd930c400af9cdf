#!/usr/bin/env python3
"""Run llama.cpp and anna side by side on one GGUF and print a single comparison table.

Speed (median of --runs runs):
  llama.cpp: llama-bench -m FILE -p 512 -n 128 -t N -r RUNS -o json
  anna:      anna-bench --model FILE --threads N --prompt-len 512 --max-new-tokens 128
                        --runs RUNS --json
             stdout must hold one JSON object with "prefill_tok_s" and "decode_tok_s",
             both arrays of per-run tok/s values.
Correctness (teacher forcing over the first --n-eval tokens of --text):
  The text is tokenized once by llama.cpp's tokenizer (the llama-cpp-python binding
  from the same sdist that setup_llamacpp.sh built), so both engines score the
  same ids.
  llama.cpp: the binding with logits_all=True gives logits for every position.
  anna:      anna-generate --model FILE --prompt-ids ID,ID,... --max-new-tokens 0
                           --dump-logits OUT.f32
             OUT.f32 must be raw little-endian float32 [n_tokens, n_vocab], with row i
             holding the logits after consuming ids[0..i].
  The table reports top-1 agreement (argmax anna == argmax llama.cpp for each
  position), each engine's perplexity on the text (positions 0..n-2 predicting ids
  1..n-1), mean/max KL(llama.cpp || anna) and max |logit difference|.

A missing or failing anna tool is reported as "anna: not available (...)". That's
expected until anna-bench and anna-generate exist. The llama.cpp half needs
scripts/setup_llamacpp.sh to have run.

The correctness half runs in a worker subprocess under the llama.cpp venv's python,
which has numpy and the binding. Any python3 can run this front end.
"""

import argparse
import glob
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("ANNA_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "anna")
DEFAULT_TEXT = os.path.join(REPO, "bench", "data", "public_domain_en.txt")


# ----------------------------------------------------------------------------- locating tools

def read_env_sh(path):
    """Parse the `export K="V"` lines that setup_llamacpp.sh writes."""
    env = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith("export ") and "=" in line:
                    k, v = line[len("export "):].split("=", 1)
                    env[k.strip()] = v.strip().strip('"')
    except OSError:
        pass
    return env


def find_llama(args):
    root = os.path.join(CACHE, "llama.cpp")
    env = read_env_sh(os.path.join(root, "env.sh"))
    bindir = args.llama_bin or os.environ.get("LLAMA_CPP_BIN") or env.get("LLAMA_CPP_BIN") \
        or os.path.join(root, "build", "bin")
    py = env.get("LLAMA_CPP_PY") or os.path.join(root, "venv", "bin", "python")
    pypath = env.get("LLAMA_CPP_PYTHONPATH")
    if not pypath:
        cands = sorted(glob.glob(os.path.join(root, "src", "llama_cpp_python-*")))
        pypath = cands[-1] if cands else ""
    return {"bin": bindir, "py": py, "pythonpath": pypath,
            "libpath": env.get("LLAMA_CPP_LIB_PATH") or bindir}


def find_anna_tool(name, args):
    if args.skip_anna:
        return None
    dirs = []
    if args.anna_bin:
        dirs.append(args.anna_bin)
    if os.environ.get("ANNA_BIN"):
        dirs.append(os.environ["ANNA_BIN"])
    if not args.anna_bin:
        # Sanitizer/debug trees would give meaningless speed figures; never pick
        # them implicitly (pass --anna-bin to use one on purpose).
        others = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REPO, "build*"))
                        if not any(t in os.path.basename(p) for t in ("asan", "san", "debug", "dbg")))
        for b in ["build", "build-release"] + others:
            for sub in ("src/cli", "bin", ""):
                dirs.append(os.path.join(REPO, b, sub))
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    if not args.anna_bin:
        return shutil.which(name)
    return None


# ----------------------------------------------------------------------------- helpers

def run_cmd(cmd, timeout, env=None):
    """Run cmd; return (rc, stdout, stderr). rc None on timeout or spawn failure."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or "", f"timed out after {timeout}s"
    except OSError as e:
        return None, "", str(e)


def _proc_stat():
    """(total jiffies, idle+iowait jiffies) over all CPUs, or None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v), v[3] + v[4]
    except (OSError, ValueError, IndexError):
        return None


def run_measured(cmd, timeout):
    """run_cmd plus the share of all CPUs that *other* processes used meanwhile.

    On a shared 2-core box another build easily halves a 2-thread benchmark, and
    spin-waiting thread pools make it worse, so the table flags such runs."""
    import resource
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    s0, r0, w0 = _proc_stat(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time()
    rc, out, err = run_cmd(cmd, timeout)
    s1, r1, wall = _proc_stat(), resource.getrusage(resource.RUSAGE_CHILDREN), time.time() - w0
    others = None
    if s0 and s1 and wall > 0:
        own = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
        busy = ((s1[0] - s0[0]) - (s1[1] - s0[1])) / tick
        others = max(0.0, busy - own) / ((os.cpu_count() or 1) * wall) * 100
    return rc, out, err, others


def last_line(s):
    lines = [ln for ln in (s or "").strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def parse_json_stdout(out):
    """Whole stdout as JSON, else the last line that parses as a JSON object."""
    try:
        return json.loads(out)
    except ValueError:
        pass
    for ln in reversed(out.strip().splitlines()):
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                return json.loads(ln)
            except ValueError:
                continue
    return None


def num_list(v):
    if not isinstance(v, list) or not v:
        return None
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            return None
        out.append(float(x))
    return out


def sha256_prefix(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for blk in iter(lambda: f.read(1 << 20), b""):
            h.update(blk)
    return h.hexdigest()[:16]


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for ln in out.splitlines():
            if ln.startswith("Model name:"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ----------------------------------------------------------------------------- speed

def llama_speed(llama, a):
    """pp at depth 0, and tg at depth = prompt length: anna-bench decodes right after its
    prompt, so llama.cpp's decode is measured with the same context behind it (-d)."""
    exe = os.path.join(llama["bin"], "llama-bench")
    if not os.access(exe, os.X_OK):
        return {"error": f"{exe} missing (run scripts/setup_llamacpp.sh)"}
    base = [exe, "-m", a.model, "-t", str(a.threads), "-r", str(a.runs), "-o", "json"]
    cmds = [base + ["-p", str(a.prompt_len), "-n", "0"],
            base + ["-p", "0", "-n", str(a.gen_len), "-d", str(a.prompt_len)]]
    res = {"cmd": cmds, "others_cpu_pct": 0.0}
    for cmd in cmds:
        rc, out, err, others = run_measured(cmd, a.timeout)
        res["others_cpu_pct"] = max(res["others_cpu_pct"], others or 0.0)
        if rc != 0:
            return {"error": f"llama-bench failed (rc={rc}): {last_line(err)}", "cmd": cmd}
        data = parse_json_stdout(out)
        if not isinstance(data, list):
            return {"error": "llama-bench printed no JSON list", "cmd": cmd}
        for e in data:
            if not isinstance(e, dict):
                continue
            samples = num_list(e.get("samples_ts"))
            if samples is None:
                continue
            if e.get("n_prompt") == a.prompt_len and e.get("n_gen") == 0:
                res["prefill"] = samples
            elif e.get("n_gen") == a.gen_len and e.get("n_prompt") == 0:
                res["decode"] = samples
            for k in ("build_commit", "cpu_info", "type_k", "model_type"):
                if k in e and k not in res:
                    res[k] = e[k]
    if "prefill" not in res or "decode" not in res:
        res["error"] = "llama-bench JSON lacks pp/tg entries"
    return res


def anna_speed(a):
    exe = find_anna_tool("anna-bench", a)
    if not exe:
        return {"error": "anna-bench not found"}
    cmd = [exe, "--model", a.model, "--threads", str(a.threads),
           "--prompt-len", str(a.prompt_len), "--max-new-tokens", str(a.gen_len),
           "--runs", str(a.runs), "--json"]
    rc, out, err, others = run_measured(cmd, a.timeout)
    if rc != 0:
        return {"error": f"anna-bench failed (rc={rc}): {last_line(err) or last_line(out)}",
                "cmd": cmd}
    data = parse_json_stdout(out)
    if not isinstance(data, dict):
        return {"error": "anna-bench printed no JSON object", "cmd": cmd}
    pre, dec = num_list(data.get("prefill_tok_s")), num_list(data.get("decode_tok_s"))
    if pre is None or dec is None:
        return {"error": "anna-bench JSON lacks numeric arrays prefill_tok_s/decode_tok_s",
                "cmd": cmd}
    return {"cmd": cmd, "prefill": pre, "decode": dec, "others_cpu_pct": others, "anna_tool": exe}


def least_contended(fn, retries, threshold=5.0):
    """Repeat a speed measurement while other processes ate >= threshold% of the
    CPU, up to `retries` extra times; keep the least disturbed result."""
    best = fn()
    for i in range(retries):
        o = best.get("others_cpu_pct")
        if "error" in best or o is None or o < threshold:
            break
        print(f"[compare]   contended ({o:.0f}% other CPU), retry {i + 1}/{retries}", file=sys.stderr)
        time.sleep(5)
        r = fn()
        if "error" not in r and (r.get("others_cpu_pct") or 0) < o:
            best = r
    return best


# ----------------------------------------------------------------------------- correctness

def correctness(llama, a):
    """Run the worker under the llama.cpp venv python; it returns one JSON object."""
    if not os.access(llama["py"], os.X_OK) or not llama["pythonpath"]:
        return {"error": "llama.cpp python binding not set up (run scripts/setup_llamacpp.sh)"}
    anna_gen = find_anna_tool("anna-generate", a)
    env = dict(os.environ)
    env["PYTHONPATH"] = llama["pythonpath"] + (os.pathsep + env["PYTHONPATH"]
                                               if env.get("PYTHONPATH") else "")
    env["LLAMA_CPP_LIB_PATH"] = llama["libpath"]
    with tempfile.TemporaryDirectory(prefix="anna-cmp-") as tmp:
        cmd = [llama["py"], os.path.abspath(__file__), "--_worker", "--model", a.model,
               "--text", a.text, "--n-eval", str(a.n_eval), "--threads", str(a.threads),
               "--timeout", str(a.timeout), "--tmp", tmp,
               "--anna-generate", anna_gen or ""]
        if a.anna_generate_args:
            cmd += ["--anna-generate-args=" + a.anna_generate_args]  # "=": values may start with "--"
        rc, out, err = run_cmd(cmd, 2 * a.timeout + 60, env=env)
        if rc != 0:
            return {"error": f"correctness worker failed (rc={rc}): {last_line(err)}"}
        data = parse_json_stdout(out)
        if not isinstance(data, dict):
            return {"error": "correctness worker printed no JSON"}
        if anna_gen:
            data["anna_tool"] = anna_gen
        return data


def worker(a):
    """Runs under the venv python: numpy and llama_cpp are importable here."""
    import numpy as np
    import llama_cpp

    with open(a.text, "rb") as f:
        text = f.read().decode("utf-8")
    res = {}
    t0 = time.time()
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=max(a.n_eval, 64) + 16,
                          n_batch=512, n_threads=a.threads, n_threads_batch=a.threads,
                          logits_all=True, verbose=False)
    # add_bos=True means "add the model's special tokens", so llama.cpp honours
    # tokenizer.ggml.add_bos_token itself (Qwen: none, Gemma/Llama: BOS).
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)[: a.n_eval]
    n = len(ids)
    if n < 2:
        print(json.dumps({"error": "text too short after tokenization"}))
        return 0
    llm.eval(ids)
    ll = np.array(llm.scores[:n, :], dtype=np.float32, copy=True)
    vocab = ll.shape[1]
    res.update({"n_tokens": n, "n_vocab": vocab, "llama_seconds": round(time.time() - t0, 2),
                "first_ids": ids[:8]})
    del llm

    def logprobs(x):
        x = x.astype(np.float64)
        m = x.max(axis=1, keepdims=True)
        return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))

    def ppl_and_acc(logits):
        lp = logprobs(logits[: n - 1])
        nll = -lp[np.arange(n - 1), np.asarray(ids[1:])]
        acc = float((logits[: n - 1].argmax(axis=1) == np.asarray(ids[1:])).mean())
        return float(np.exp(nll.mean())), acc, lp

    res["llama_ppl"], res["llama_next_acc"], lp_l = ppl_and_acc(ll)

    if not a.anna_generate:
        res["anna_error"] = "anna-generate not found"
        print(json.dumps(res))
        return 0
    out = os.path.join(a.tmp, "anna_logits.f32")
    cmd = [a.anna_generate, "--model", a.model, "--prompt-ids", ",".join(map(str, ids)),
           "--max-new-tokens", "0", "--dump-logits", out]
    if a.anna_generate_args:
        cmd += a.anna_generate_args.split()
    t0 = time.time()
    rc, so, se = run_cmd(cmd, a.timeout)
    res["anna_seconds"] = round(time.time() - t0, 2)
    if rc != 0:
        res["anna_error"] = f"anna-generate failed (rc={rc}): {last_line(se) or last_line(so)}"
    elif not os.path.isfile(out):
        res["anna_error"] = "anna-generate wrote no logits file"
    else:
        size = os.path.getsize(out)
        if size == 0 or size % (4 * n) != 0:
            res["anna_error"] = f"logits file has {size} bytes, not a multiple of 4*{n}"
        else:
            va = size // (4 * n)
            al = np.fromfile(out, dtype="<f4").reshape(n, va)
            if va != vocab:
                # A padded vocab on one side: compare on the shared ids only.
                res["vocab_note"] = f"anna vocab {va} != llama.cpp vocab {vocab}; compared first {min(va, vocab)}"
                v = min(va, vocab)
                al = al[:, :v]
                llv = ll[:, :v]
                lp_lv = logprobs(llv[: n - 1])
            else:
                llv, lp_lv = ll, lp_l
            if not np.isfinite(al).all():
                res["anna_error"] = f"logits contain {int((~np.isfinite(al)).sum())} non-finite values"
            else:
                res["anna_ppl"], res["anna_next_acc"], lp_a = ppl_and_acc(al)
                agree = al.argmax(axis=1) == llv.argmax(axis=1)
                res["top1_agree"] = float(agree.mean())
                res["top1_first_mismatch"] = int(np.argmin(agree)) if not agree.all() else -1
                p_l = np.exp(lp_lv)
                kl = (p_l * (lp_lv - lp_a)).sum(axis=1)
                res["kl_mean"] = float(kl.mean())
                res["kl_max"] = float(kl.max())
                res["max_abs_logit_diff"] = float(np.abs(al - llv).max())
    print(json.dumps(res))
    return 0


# ----------------------------------------------------------------------------- report

def fmt(x, nd=2):
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="GGUF file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--text", default=DEFAULT_TEXT, help="UTF-8 text for correctness")
    ap.add_argument("--n-eval", type=int, default=512, help="max tokens of --text to score")
    ap.add_argument("--anna-bin", help="dir holding anna-bench/anna-generate "
                    "(default: $ANNA_BIN, build*/src/cli, then PATH)")
    ap.add_argument("--anna-generate-args", default="",
                    help="extra args appended to anna-generate (e.g. '--threads 2')")
    ap.add_argument("--llama-bin", help="llama.cpp bin dir (default: from setup_llamacpp.sh)")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--skip-anna", action="store_true", help="llama.cpp half only")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per tool run")
    ap.add_argument("--retries", type=int, default=2,
                    help="re-run a speed measurement up to N times while other processes "
                         "use >= 5%% of the CPU; the least disturbed run is reported")
    ap.add_argument("--json", dest="json_out", help="also write all results to this file")
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    ap.add_argument("--anna-generate", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.threads < 1 or a.runs < 1 or a.prompt_len < 1 or a.gen_len < 1 or a.n_eval < 2:
        ap.error("--threads/--runs/--prompt-len/--gen-len must be >= 1, --n-eval >= 2")

    if a._worker:
        return worker(a)

    if not os.path.isfile(a.model):
        print(f"error: model {a.model} not found", file=sys.stderr)
        return 2
    a.model = os.path.abspath(a.model)
    llama = find_llama(a)
    results = {"model": a.model, "model_sha256_16": sha256_prefix(a.model),
               "model_bytes": os.path.getsize(a.model), "threads": a.threads,
               "runs": a.runs, "cpu": cpu_name(), "nproc": os.cpu_count(),
               "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "text": os.path.relpath(a.text, REPO) if a.text.startswith(REPO) else a.text}

    if not a.skip_speed:
        print(f"[compare] llama-bench pp{a.prompt_len}/tg{a.gen_len} x{a.runs} ...", file=sys.stderr)
        results["llama_speed"] = least_contended(lambda: llama_speed(llama, a), a.retries)
        print("[compare] anna-bench ...", file=sys.stderr)
        results["anna_speed"] = least_contended(lambda: anna_speed(a), a.retries)
    if not a.skip_correctness:
        print(f"[compare] teacher-forced logits over <= {a.n_eval} tokens ...", file=sys.stderr)
        results["correctness"] = correctness(llama, a)

    # ---- table
    print(f"model   {a.model}  ({results['model_bytes'] / 1e6:.1f} MB, sha256 {results['model_sha256_16']}...)")
    for k in ("anna_speed", "correctness"):
        if results.get(k, {}).get("anna_tool"):
            print(f"anna    {results[k]['anna_tool']}")
    print(f"machine {results['cpu']}, {results['nproc']} cpus; threads={a.threads} runs={a.runs}; {results['date_utc']}")
    rows = []
    notes = []
    if not a.skip_speed:
        ls, ans = results["llama_speed"], results["anna_speed"]
        for key, label in (("prefill", f"prefill tok/s (pp{a.prompt_len}, median)"),
                           ("decode", f"decode tok/s (tg{a.gen_len} @ d{a.prompt_len}, median)")):
            lv = statistics.median(ls[key]) if key in ls else None
            av = statistics.median(ans[key]) if key in ans else None
            rows.append((label, fmt(lv), fmt(av), ratio(av, lv)))
        if "error" in ls:
            notes.append(f"llama.cpp speed: {ls['error']}")
        if "error" in ans:
            notes.append(f"anna: not available ({ans['error']})")
        for who, r in (("llama.cpp", ls), ("anna", ans)):
            o = r.get("others_cpu_pct")
            if o is not None and o >= 5:
                notes.append(f"{who} speed runs shared the CPU: other processes used {o:.0f}% "
                             f"of all cores meanwhile; tok/s is understated")
    if not a.skip_correctness:
        c = results["correctness"]
        if "error" in c:
            notes.append(f"correctness: {c['error']}")
        else:
            n = c["n_tokens"]
            rows.append((f"perplexity ({n} tok)", fmt(c.get("llama_ppl"), 4),
                         fmt(c.get("anna_ppl"), 4), ratio(c.get("anna_ppl"), c.get("llama_ppl"))))
            rows.append(("next-token top-1 acc", fmt(c.get("llama_next_acc"), 4),
                         fmt(c.get("anna_next_acc"), 4), ""))
            ag = c.get("top1_agree")
            rows.append(("top-1 agreement anna vs llama.cpp", "", fmt(ag, 4) if ag is not None else "n/a",
                         f"{ag * 100:.1f}%" if ag is not None else ""))
            if "kl_mean" in c:
                rows.append(("KL(llama.cpp||anna) mean / max", "",
                             f"{c['kl_mean']:.2e} / {c['kl_max']:.2e}", ""))
                rows.append(("max |logit diff|", "", fmt(c["max_abs_logit_diff"], 4), ""))
            if c.get("anna_error"):
                notes.append(f"anna: not available ({c['anna_error']})")
            if c.get("vocab_note"):
                notes.append(c["vocab_note"])
    w0 = max([len(r[0]) for r in rows] + [6])
    print(f"{'metric':<{w0}}  {'llama.cpp':>12}  {'anna':>20}  {'anna/llama':>10}")
    print("-" * (w0 + 50))
    for r in rows:
        print(f"{r[0]:<{w0}}  {r[1]:>12}  {r[2]:>20}  {r[3]:>10}")
    for nt in dict.fromkeys(notes):
        print(f"note: {nt}")
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
