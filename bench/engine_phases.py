#!/usr/bin/env python3
"""Where anna-serve's engine thread spent a benchmark's time, from two /metrics scrapes.

  engine_phases.py BEFORE.prom AFTER.prom [--bench http_bench.json] [--label L] [--json]

BEFORE / AFTER: the server's /metrics text before and after the run (curl -s URL/metrics).
Prints one block: steps by kind (decode only, mixed decode + prompt, prompt only), rows per
step, model calls and how many replayed as CUDA graphs, forward ms per step kind, every
phase's ms per step (anna_engine_step_seconds{phase=...}; see src/server/metrics.h), the host
overhead (step - forward) per step and per generated token, and the engine's busy share of the
wall time; with --bench, the http_bench summary's output tok/s, TTFT and ITL next to it.
bench/notes/engine.md explains the columns; scripts/gpu/engine_profile.sh drives it.
"""
from __future__ import annotations

import argparse
import json
import sys

PHASES = ("idle", "sched", "admit", "assemble", "forward", "sample", "detok", "publish", "wake", "finish", "stats", "step")
KINDS = ("decode", "mixed", "prefill")


def prom(path: str) -> dict[str, float]:
    out = {}
    with open(path, errors="replace") as f:
        for ln in f:
            ln = ln.strip()
            if ln and not ln.startswith("#"):
                k, _, v = ln.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
    return out


def summarize(before: dict, after: dict) -> dict:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    g = lambda k: d.get(k, 0.0)  # noqa: E731
    steps_k = {k: g(f'anna_engine_steps_total{{kind="{k}"}}') for k in KINDS}
    steps = sum(steps_k.values())
    n = steps or 1.0
    ph = {p: 1000.0 * g(f'anna_engine_step_seconds_sum{{phase="{p}"}}') / n for p in PHASES}
    fwd = {k: (1000.0 * g(f'anna_engine_forward_seconds_sum{{kind="{k}"}}') / steps_k[k]) if steps_k[k] else 0.0
           for k in KINDS}
    tokens = g("anna_completion_tokens_total")
    host_ms = ph["step"] - ph["forward"]
    busy_s = g('anna_engine_step_seconds_sum{phase="step"}')
    idle_s = g('anna_engine_step_seconds_sum{phase="idle"}')
    return {
        "steps": steps, "steps_by_kind": steps_k,
        "decode_rows_per_step": g('anna_engine_step_rows_sum{kind="decode"}') / n,
        "prefill_rows_per_step": g('anna_engine_step_rows_sum{kind="prefill"}') / n,
        "forward_calls": g("anna_engine_forward_calls_total"),
        "graph_steps": g("anna_engine_graph_steps_total"),
        "full_rows": g("anna_engine_full_rows_total"),
        "forward_ms_by_kind": fwd, "ms_per_step": ph,
        "host_ms_per_step": host_ms,
        "host_us_per_token": 1000.0 * host_ms * steps / tokens if tokens else 0.0,
        "tokens": tokens, "prompt_tokens": g("anna_prompt_tokens_total"),
        "busy_share": busy_s / (busy_s + idle_s) if busy_s + idle_s > 0 else 0.0,
    }


def render(s: dict, label: str, bench: dict | None) -> str:
    out = []
    if bench:
        f = lambda v: "?" if v is None else f"{v:.1f}"  # noqa: E731
        out.append(f"{label}: {bench['counts']['successful']}/{bench['counts']['requests']} ok, "
                   f"{f(bench.get('output_tok_per_s'))} output tok/s, TTFT p50 {f(bench['ttft_ms']['p50'])} ms, "
                   f"ITL p50/p99 {f(bench['itl_ms']['p50'])}/{f(bench['itl_ms']['p99'])} ms")
    else:
        out.append(f"{label}:")
    k = s["steps_by_kind"]
    out.append(f"  steps {s['steps']:.0f} (decode {k['decode']:.0f}, mixed {k['mixed']:.0f}, prefill {k['prefill']:.0f}); "
               f"rows/step decode {s['decode_rows_per_step']:.1f}, prefill {s['prefill_rows_per_step']:.1f}; "
               f"model calls {s['forward_calls']:.0f}, as CUDA graphs {s['graph_steps']:.0f}; "
               f"rows sampled whole (logits downloaded) {s['full_rows']:.0f}")
    fk = s["forward_ms_by_kind"]
    out.append(f"  forward ms/step: decode {fk['decode']:.3f}, mixed {fk['mixed']:.3f}, prefill {fk['prefill']:.3f}")
    out.append("  | " + " | ".join(PHASES) + " |")
    out.append("  |" + "---:|" * len(PHASES))
    out.append("  | " + " | ".join(f"{s['ms_per_step'][p]:.3f}" for p in PHASES) + " |  (ms per step)")
    out.append(f"  host (step - forward) {s['host_ms_per_step']:.3f} ms/step = {s['host_us_per_token']:.1f} us per "
               f"generated token ({s['tokens']:.0f} tokens, {s['prompt_tokens']:.0f} prompt tokens); "
               f"engine busy {100.0 * s['busy_share']:.0f}% of its time")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--bench", help="http_bench --output JSON of the same run")
    ap.add_argument("--label", default="run")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = ap.parse_args(argv)
    s = summarize(prom(a.before), prom(a.after))
    bench = None
    if a.bench:
        try:
            b = json.load(open(a.bench))
            bench = b[-1] if isinstance(b, list) else b
        except (OSError, ValueError):
            bench = None
    if a.json:
        s["label"] = a.label
        if bench:
            s["bench"] = {"output_tok_per_s": bench.get("output_tok_per_s"), "ttft_ms": bench.get("ttft_ms"),
                          "itl_ms": bench.get("itl_ms"), "counts": bench.get("counts")}
        print(json.dumps(s))
    else:
        print(render(s, a.label, bench))
    return 0


if __name__ == "__main__":
    sys.exit(main())
