#!/usr/bin/env python3
"""Load test for anna-serve (or any OpenAI-compatible server): many requests at a fixed
concurrency, a mix of streaming and non-streaming chat/completions, a fraction of clients
that go away early, and a check of every answer and of the server afterwards.

    bench/load_test.py --base-url http://127.0.0.1:8080 --requests 2000 --concurrency 256 \
        --disconnect-fraction 0.2 --pid $(pidof anna-serve) --expect-503 --json load.json

Raw HTTP (http.client, one connection per request, a thread per in-flight request): the
official client hides what is checked here (SSE framing, [DONE], the exact status and
headers of an error, a socket closed mid-stream).

Per request (deterministic from --seed): route chat or completions, stream or not (streams
mostly with stream_options.include_usage), n = 1 or 2, max_tokens 1..--max-tokens, some
ignore_eos (then every choice must make exactly max_tokens tokens), some stop strings, a
shared prompt prefix for a third of them (the prefix cache's hits and copy-on-write). A
--disconnect-fraction of them close the socket early: halfway through sending the body,
before the first response byte, or (streams) after a few events.

Checks (each failure is listed; exit status 1 when any):
  * status: 200, or 503 with Retry-After when --expect-503 (429 with Retry-After too: queue
    full is admitted backpressure); anything else fails, 5xx above all;
  * body: the OpenAI object (id, object, created, model, choices[index, message|text,
    finish_reason], usage with total = prompt + completion, completion <= n * max_tokens);
  * SSE: every event `data: <json>` + blank line, one id / created over the chunks, one
    finish_reason per choice, the usage chunk (choices == []) last when asked for,
    `data: [DONE]` at the end and nothing after; an error event only as 503-like
    (resources_exhausted) with --expect-503;
  * after the run, once the server is idle: the process is alive (--pid), /healthz answers,
    a fresh request completes, KV blocks: used == 0 or, where /healthz accounts blocks by
    holder, held by sequences == 0 and unaccounted == 0; /metrics: no 5xx other than 503s
    during the run (a disconnect counted as a 500 fails here), preemptions > 0 with
    --expect-preemptions; RSS before / peak / after (--max-rss-growth-mb fails on growth).
The summary table is printed last; --json OUT writes it as JSON.
Exit status: 0 all checks passed, 1 a check failed, 2 usage error.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.client
import json
import os
import random
import socket
import sys
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud maple ember "
         "harbor lantern meadow orbit pixel quartz saddle timber velvet willow").split()
SHARED_PREFIX = ("You are a careful assistant for a hardware shop. Answer briefly. " * 6).strip()
FINISH = {"stop", "length", "tool_calls"}


@dataclass
class Plan:
    index: int
    route: str  # chat | completions
    stream: bool
    usage: bool
    n: int
    max_tokens: int
    ignore_eos: bool
    stop: list[str] | None
    shared: bool
    disconnect: str  # "" | mid_upload | before_first_byte | mid_stream
    cut_after: int  # events read before a mid_stream close
    words: list[str]


@dataclass
class Result:
    index: int
    outcome: str = ""  # ok | disconnected | busy | failed
    status: int | None = None
    error: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    events: int = 0
    seconds: float = 0.0


def make_plans(a: argparse.Namespace) -> list[Plan]:
    rng = random.Random(a.seed)
    plans = []
    for i in range(a.requests):
        route = "chat" if rng.random() < 0.7 else "completions"
        stream = rng.random() < a.stream_fraction
        disconnect = ""
        if rng.random() < a.disconnect_fraction:
            r = rng.random()
            disconnect = ("mid_stream" if stream and r < 0.6 else "mid_upload" if r > 0.85
                          else "before_first_byte")
        ignore_eos = rng.random() < 0.3
        stop = None if ignore_eos or rng.random() < 0.8 else [rng.choice((".", "\n", " the"))]
        plans.append(Plan(index=i, route=route, stream=stream, usage=not stream or rng.random() < 0.85,
                          n=2 if rng.random() < 0.1 and a.max_n > 1 else 1, max_tokens=rng.randint(1, a.max_tokens),
                          ignore_eos=ignore_eos, stop=stop, shared=rng.random() < 0.33,
                          disconnect=disconnect, cut_after=rng.randint(1, 4),
                          words=[rng.choice(WORDS) for _ in range(rng.randint(3, a.prompt_words))]))
    return plans


def request_body(p: Plan, model: str) -> dict[str, Any]:
    text = f"request {p.index}: " + " ".join(p.words)
    if p.shared:
        text = SHARED_PREFIX + " " + text
    b: dict[str, Any] = {"model": model, "max_tokens": p.max_tokens, "n": p.n, "temperature": 0.7,
                         "seed": p.index}
    if p.route == "chat":
        b["messages"] = [{"role": "user", "content": text}]
    else:
        b["prompt"] = text
    if p.ignore_eos:
        b["ignore_eos"] = True
    if p.stop:
        b["stop"] = p.stop
    if p.stream:
        b["stream"] = True
        if p.usage:
            b["stream_options"] = {"include_usage": True}
    return b


class Bad(Exception):
    """A malformed answer: the message says what was wrong."""


def check_usage(u: Any, p: Plan, where: str) -> tuple[int, int]:
    if not isinstance(u, dict):
        raise Bad(f"{where}: usage is not an object: {u!r}")
    pt, ct, tt = u.get("prompt_tokens"), u.get("completion_tokens"), u.get("total_tokens")
    if not all(isinstance(x, int) and x >= 0 for x in (pt, ct, tt)):
        raise Bad(f"{where}: usage fields are not counts: {u!r}")
    if pt < 1 or pt + ct != tt:
        raise Bad(f"{where}: usage does not add up: {u!r}")
    if ct > p.n * p.max_tokens:
        raise Bad(f"{where}: completion_tokens {ct} > n {p.n} x max_tokens {p.max_tokens}")
    if p.ignore_eos and not p.stop and ct != p.n * p.max_tokens:
        raise Bad(f"{where}: ignore_eos without stop made {ct} tokens, not n x max_tokens = {p.n * p.max_tokens}")
    return pt, ct


def check_error_body(body: bytes, status: int) -> None:
    try:
        e = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        raise Bad(f"HTTP {status} without an OpenAI error object: {body[:200]!r}") from None
    if not isinstance(e, dict) or not isinstance(e.get("message"), str) or "type" not in e:
        raise Bad(f"HTTP {status}: malformed error object {e!r}")


def check_object(o: Any, p: Plan, model: str) -> tuple[int, int]:
    want = "chat.completion" if p.route == "chat" else "text_completion"
    if not isinstance(o, dict) or o.get("object") != want:
        raise Bad(f"object is not a {want}: {str(o)[:200]}")
    if not isinstance(o.get("id"), str) or not o["id"] or not isinstance(o.get("created"), int):
        raise Bad("id / created missing")
    if o.get("model") != model:
        raise Bad(f"model {o.get('model')!r} != {model!r}")
    ch = o.get("choices")
    if not isinstance(ch, list) or sorted(c.get("index") for c in ch if isinstance(c, dict)) != list(range(p.n)):
        raise Bad(f"choices do not have indices 0..{p.n - 1}: {str(ch)[:200]}")
    for c in ch:
        if c.get("finish_reason") not in FINISH:
            raise Bad(f"choice {c.get('index')}: finish_reason {c.get('finish_reason')!r}")
        if p.route == "chat":
            m = c.get("message")
            if not isinstance(m, dict) or m.get("role") != "assistant" or not isinstance(m.get("content"), (str, type(None))):
                raise Bad(f"choice {c.get('index')}: malformed message {str(m)[:200]}")
        elif not isinstance(c.get("text"), str):
            raise Bad(f"choice {c.get('index')}: text is not a string")
        if p.ignore_eos and not p.stop and c.get("finish_reason") != "length":
            raise Bad(f"choice {c.get('index')}: ignore_eos ended with {c.get('finish_reason')!r}, not length")
    return check_usage(o.get("usage"), p, "usage")


def read_sse(resp: http.client.HTTPResponse, p: Plan, model: str, res: Result, expect_503: bool,
             conn: http.client.HTTPConnection) -> None:
    """Reads and checks the whole stream, or closes it after p.cut_after events."""
    want = "chat.completion.chunk" if p.route == "chat" else "text_completion"
    ids, created = set(), set()
    finished: set[int] = set()
    errored: set[int] = set()
    usage_seen = None
    done = False
    while True:
        line = resp.readline()
        if not line:
            break
        if done:
            raise Bad(f"bytes after data: [DONE]: {line[:80]!r}")
        if not line.startswith(b"data: ") or not line.endswith(b"\n"):
            raise Bad(f"SSE line is not 'data: ...': {line[:80]!r}")
        blank = resp.readline()
        if blank != b"\n":
            raise Bad(f"SSE event not followed by a blank line: {blank[:80]!r}")
        payload = line[6:].strip()
        res.events += 1
        if payload == b"[DONE]":
            done = True
            continue
        try:
            o = json.loads(payload)
        except ValueError:
            raise Bad(f"SSE event is not JSON: {payload[:120]!r}") from None
        if usage_seen is not None:
            raise Bad("an event after the usage chunk")
        if "error" in o:
            code = (o.get("error") or {}).get("code")
            if not (expect_503 and code == "resources_exhausted"):
                raise Bad(f"error event in the stream: {str(o)[:200]}")
            res.outcome = "busy"
            continue
        if o.get("object") != want or not isinstance(o.get("id"), str) or not isinstance(o.get("created"), int):
            raise Bad(f"chunk is not a {want} with id and created: {str(o)[:200]}")
        if o.get("model") != model:
            raise Bad(f"chunk model {o.get('model')!r} != {model!r}")
        ids.add(o["id"])
        created.add(o["created"])
        ch = o.get("choices")
        if not isinstance(ch, list):
            raise Bad("chunk choices is not a list")
        if ch == [] and o.get("usage") is not None:
            usage_seen = o["usage"]
        elif p.usage and "usage" in o and o["usage"] is not None:
            raise Bad("usage on a chunk that has choices")
        for c in ch:
            i = c.get("index")
            if not isinstance(i, int) or not 0 <= i < p.n:
                raise Bad(f"chunk choice index {i!r}")
            if i in finished:
                raise Bad(f"choice {i}: a chunk after its finish_reason")
            if p.route == "chat":
                d = c.get("delta")
                if not isinstance(d, dict) or d.get("role", "assistant") != "assistant":
                    raise Bad(f"choice {i}: malformed delta {str(d)[:120]}")
            elif not isinstance(c.get("text"), str):
                raise Bad(f"choice {i}: text is not a string")
            fr = c.get("finish_reason")
            if fr is not None:
                # anna ends a choice that failed with "error", then sends the error event
                if fr == "error":
                    errored.add(i)
                elif fr not in FINISH:
                    raise Bad(f"choice {i}: finish_reason {fr!r}")
                finished.add(i)
        if p.disconnect == "mid_stream" and res.events >= p.cut_after:
            hang_up(conn)
            res.outcome = "disconnected"
            return
    if not done:
        raise Bad(f"stream ended without data: [DONE] after {res.events} events")
    if len(ids) > 1 or len(created) > 1:
        raise Bad(f"chunks disagree on id / created: {ids} {created}")
    if res.outcome == "busy":
        return
    if errored:
        raise Bad(f"choices {sorted(errored)} ended with finish_reason 'error' and no error event")
    if finished != set(range(p.n)):
        raise Bad(f"finish_reason seen for choices {sorted(finished)}, want 0..{p.n - 1}")
    if p.usage:
        if usage_seen is None:
            raise Bad("include_usage asked, no usage chunk before [DONE]")
        res.prompt_tokens, res.completion_tokens = check_usage(usage_seen, p, "stream usage")


def hang_up(conn: http.client.HTTPConnection) -> None:
    s = conn.sock
    try:
        if s is not None:
            # RST rather than FIN: what a killed client looks like
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
    except OSError:
        pass
    conn.close()


def run_one(a: argparse.Namespace, host: str, port: int, prefix: str, model: str, p: Plan,
            rng_delay: float) -> Result:
    res = Result(index=p.index)
    t0 = time.monotonic()
    if getattr(a, "stop_at", None) and t0 > a.stop_at:
        res.outcome = "not_sent"
        return res
    conn = http.client.HTTPConnection(host, port, timeout=a.timeout)
    path = prefix + ("/v1/chat/completions" if p.route == "chat" else "/v1/completions")
    try:
        body = json.dumps(request_body(p, model)).encode()
        if p.disconnect == "mid_upload":
            # headers and half the body: the server has not parsed the request yet
            conn.putrequest("POST", path)
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body[: len(body) // 2])
            time.sleep(rng_delay)
            hang_up(conn)
            res.outcome = "disconnected"
            return res
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        if p.disconnect == "before_first_byte":
            # the server is tokenizing, queueing or generating: gone before any answer
            time.sleep(rng_delay)
            hang_up(conn)
            res.outcome = "disconnected"
            return res
        resp = conn.getresponse()
        res.status = resp.status
        if resp.status in (429, 503):
            raw = resp.read()
            if not resp.getheader("Retry-After"):
                raise Bad(f"HTTP {resp.status} without Retry-After")
            check_error_body(raw, resp.status)
            if not a.expect_503:
                raise Bad(f"HTTP {resp.status} (pass --expect-503 to allow): {raw[:200]!r}")
            res.outcome = "busy"
            return res
        if resp.status != 200:
            raise Bad(f"HTTP {resp.status}: {resp.read()[:300]!r}")
        ctype = resp.getheader("Content-Type") or ""
        if p.stream:
            if not ctype.startswith("text/event-stream"):
                raise Bad(f"stream answered with Content-Type {ctype!r}")
            read_sse(resp, p, model, res, a.expect_503, conn)
        else:
            if not ctype.startswith("application/json"):
                raise Bad(f"Content-Type {ctype!r}")
            res.prompt_tokens, res.completion_tokens = check_object(json.loads(resp.read()), p, model)
        if not res.outcome:
            res.outcome = "ok"
    except Bad as e:
        res.outcome, res.error = "failed", str(e)
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.outcome, res.error = "failed", f"{type(e).__name__}: {e}"
    finally:
        conn.close()
        res.seconds = time.monotonic() - t0
    return res


# ---- server probes


def get(base: str, path: str, timeout: float = 10) -> tuple[int, bytes]:
    u = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request("GET", u.path.rstrip("/") + path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def prom(text: bytes) -> dict[str, float]:
    out = {}
    for ln in text.decode(errors="replace").splitlines():
        if ln and not ln.startswith("#"):
            k, _, v = ln.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@dataclass
class Summary:
    requests: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    by_kind: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    checks: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    completion_tokens: int = 0
    rss_mb: dict[str, float | None] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    passed: bool = False


def wait_idle(base: str, timeout: float) -> dict[str, Any] | None:
    deadline = time.time() + timeout
    h = None
    while time.time() < deadline:
        try:
            st, b = get(base, "/healthz")
            h = json.loads(b)
            s = h.get("scheduler", {})
            if s.get("running") == 0 and s.get("waiting") == 0 and h.get("active_http_requests", 1) <= 1:
                return h
        except (OSError, ValueError, http.client.HTTPException):
            pass
        time.sleep(0.1)
    return None


def check_blocks(h: dict[str, Any]) -> list[str]:
    kb = h.get("kv_blocks")
    if not isinstance(kb, dict):
        return []  # a server without a block pool (or another server): nothing to account
    bad = []
    total, used, free, cached = (kb.get(k) for k in ("total", "used", "free", "cached"))
    if all(isinstance(x, int) for x in (total, used, free, cached)) and total:
        if used + free + cached != total:
            bad.append(f"kv_blocks: used {used} + free {free} + cached {cached} != total {total}")
        if "unaccounted" in kb:
            if kb.get("held_by_sequences") != 0:
                bad.append(f"kv_blocks: idle, yet sequences hold {kb.get('held_by_sequences')} blocks")
            if kb.get("unaccounted") != 0:
                bad.append(f"kv_blocks: {kb.get('unaccounted')} blocks in use that no sequence or cache holds (leak)")
        elif used != 0:
            bad.append(f"kv_blocks: idle, yet {used} blocks used (leak)")
    return bad


def run(a: argparse.Namespace) -> Summary:
    u = urllib.parse.urlsplit(a.base_url)
    host, port, prefix = u.hostname or "127.0.0.1", u.port or 80, u.path.rstrip("/")
    if prefix.endswith("/v1"):
        prefix = prefix[:-3]
    base = f"{u.scheme}://{host}:{port}{prefix}"
    S = Summary(requests=a.requests)
    model = a.model
    if not model:
        st, b = get(base, "/v1/models")
        model = json.loads(b)["data"][0]["id"]
    m0 = prom(get(base, "/metrics")[1]) if a.server_checks else {}
    plans = make_plans(a)
    rng = random.Random(a.seed + 1)
    delays = [rng.uniform(0, 0.05) for _ in plans]
    peak = [rss_mb(a.pid) if a.pid else None]
    S.rss_mb["before"] = peak[0]
    stop_watch = threading.Event()

    def watch() -> None:
        while not stop_watch.wait(0.2):
            r = rss_mb(a.pid)
            if r is not None and (peak[0] is None or r > peak[0]):
                peak[0] = r

    w = threading.Thread(target=watch, daemon=True)
    if a.pid:
        w.start()
    t0 = time.monotonic()
    a.stop_at = t0 + a.deadline if a.deadline else None
    results: list[Result] = []
    with cf.ThreadPoolExecutor(max_workers=a.concurrency) as ex:
        futs = [ex.submit(run_one, a, host, port, prefix, model, p, delays[p.index]) for p in plans]
        for f in cf.as_completed(futs):
            results.append(f.result())
    S.wall_s = time.monotonic() - t0
    stop_watch.set()
    results.sort(key=lambda r: r.index)
    S.outcomes = dict(Counter(r.outcome for r in results))
    kinds: Counter[str] = Counter()
    for p, r in zip(plans, results):
        kinds[f"{p.route} {'stream' if p.stream else 'json'} {r.outcome}"] += 1
        if r.outcome == "failed":
            S.failures.append(f"#{p.index} ({p.route}, stream={p.stream}, n={p.n}, "
                              f"disconnect={p.disconnect or 'no'}): {r.error}")
        S.completion_tokens += r.completion_tokens or 0
    S.by_kind = dict(sorted(kinds.items()))
    S.checks["responses"] = "ok" if not S.failures else f"{len(S.failures)} failed"
    if S.outcomes.get("not_sent"):
        S.checks["complete"] = f"{S.outcomes['not_sent']} requests not sent (--deadline {a.deadline:g} s)"
    if a.server_checks:
        server_checks(a, base, model, m0, S)
    S.rss_mb["peak"] = peak[0]
    S.rss_mb["after"] = rss_mb(a.pid) if a.pid else None
    if a.pid and a.max_rss_growth_mb is not None and S.rss_mb["before"] and S.rss_mb["after"]:
        g = S.rss_mb["after"] - S.rss_mb["before"]
        S.checks["rss"] = "ok" if g <= a.max_rss_growth_mb else f"grew {g:.0f} MiB > {a.max_rss_growth_mb}"
    S.passed = all(v == "ok" for v in S.checks.values())
    return S


def server_checks(a: argparse.Namespace, base: str, model: str, m0: dict[str, float], S: Summary) -> None:
    if a.pid:
        S.checks["process"] = "ok" if alive(a.pid) else f"pid {a.pid} is gone"
    h = wait_idle(base, a.idle_timeout)
    if h is None:
        S.checks["idle"] = f"/healthz did not show an idle server within {a.idle_timeout:.0f} s"
        return
    S.checks["idle"] = "ok"
    S.server["kv_blocks"] = h.get("kv_blocks")
    bad = check_blocks(h)
    S.checks["kv_blocks"] = "ok" if not bad else "; ".join(bad)
    m1 = prom(get(base, "/metrics")[1])

    def delta(k: str) -> float:
        return m1.get(k, 0) - m0.get(k, 0)

    d5, d503 = delta("anna_responses_5xx_total"), delta("anna_responses_503_total")
    S.server.update(responses_5xx=d5, responses_503=d503, client_closed=delta("anna_client_closed_total"),
                    preemptions=delta("anna_preemptions_total"), cancelled=delta("anna_cancelled_total"))
    if "anna_responses_5xx_total" in m1:
        S.checks["server_5xx"] = "ok" if d5 - d503 <= 0 else f"the server counted {d5 - d503:.0f} 5xx other than 503"
    if "anna_kv_blocks_unaccounted" in m1:
        S.checks["metrics_blocks"] = ("ok" if m1["anna_kv_blocks_unaccounted"] == 0 else
                                      f"/metrics: {m1['anna_kv_blocks_unaccounted']:.0f} blocks unaccounted")
    if a.expect_preemptions:
        S.checks["preemptions"] = "ok" if delta("anna_preemptions_total") > 0 else "no preemption during the run"
    # still serving: one plain request
    p = Plan(index=-1, route="chat", stream=False, usage=True, n=1, max_tokens=4, ignore_eos=True, stop=None,
             shared=False, disconnect="", cut_after=0, words=["final", "check"])
    u = urllib.parse.urlsplit(base)
    r = run_one(a, u.hostname, u.port or 80, u.path, model, p, 0)
    S.checks["after_request"] = "ok" if r.outcome == "ok" else f"{r.outcome}: {r.error}"
    if a.pid and "process" in S.checks and S.checks["process"] == "ok" and not alive(a.pid):
        S.checks["process"] = f"pid {a.pid} is gone"


def format_table(S: Summary, a: argparse.Namespace) -> str:
    lines = [f"load test: {S.requests} requests, concurrency {a.concurrency}, disconnect fraction "
             f"{a.disconnect_fraction}, wall {S.wall_s:.1f} s, {S.completion_tokens} completion tokens"]
    for f in S.failures[:20]:
        lines.append("FAIL " + f)
    if len(S.failures) > 20:
        lines.append(f"... {len(S.failures) - 20} more failures")
    lines.append(f"{'requests by route / mode / outcome':<44}{'count':>8}")
    for k, v in S.by_kind.items():
        lines.append(f"  {k:<42}{v:>8}")
    if S.server:
        lines.append("server: " + ", ".join(f"{k}={v}" for k, v in S.server.items()))
    if a.pid:
        lines.append("RSS MiB: " + ", ".join(f"{k} {v:.0f}" if v is not None else f"{k} ?" for k, v in S.rss_mb.items()))
    lines.append(f"{'check':<20}result")
    for k, v in S.checks.items():
        lines.append(f"{k:<20}{'PASS' if v == 'ok' else 'FAIL: ' + v}")
    lines.append("RESULT " + ("PASS" if S.passed else "FAIL"))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="load_test.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8080", help="server URL (/v1 optional)")
    p.add_argument("--model", help="model id (default: the first of GET /v1/models)")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--disconnect-fraction", type=float, default=0.2,
                   help="share of requests whose client closes early (before the first byte or mid-stream)")
    p.add_argument("--stream-fraction", type=float, default=0.6, help="share of streaming requests")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens is drawn from 1..this")
    p.add_argument("--max-n", type=int, default=2, choices=(1, 2), help="one request in ten asks for n = 2 choices")
    p.add_argument("--prompt-words", type=int, default=40,
                   help="prompts have 3..this random words (with the shared prefix up to ~400 tokens on the "
                        "fixtures' 1000-token vocabularies: a server context of 512 holds them)")
    p.add_argument("--pid", type=int, help="the server's process id: alive at the end, RSS watched")
    p.add_argument("--max-rss-growth-mb", type=float, help="fail when RSS grew more than this (needs --pid)")
    p.add_argument("--expect-503", action="store_true",
                   help="503 (and 429) with Retry-After, and resources_exhausted stream errors, are admitted")
    p.add_argument("--expect-preemptions", action="store_true",
                   help="fail unless /metrics counted a preemption during the run (a small --kv-blocks pool)")
    p.add_argument("--no-server-checks", dest="server_checks", action="store_false",
                   help="skip /healthz and /metrics (a server other than anna-serve)")
    p.add_argument("--idle-timeout", type=float, default=60, help="seconds to wait for the server to go idle")
    p.add_argument("--timeout", type=float, default=300, help="per-request socket timeout, seconds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--deadline", type=float, default=0,
                   help="seconds: requests not started by then are not sent (the run fails, the server "
                        "checks still run and the summary still prints); 0 = none")
    p.add_argument("--json", metavar="OUT", help="write the summary as JSON to OUT")
    a = p.parse_args(argv)
    if a.deadline < 0:
        p.error("--deadline must be >= 0")
    if a.requests < 1 or a.concurrency < 1 or a.max_tokens < 1 or a.prompt_words < 3:
        p.error("--requests, --concurrency, --max-tokens must be >= 1 and --prompt-words >= 3")
    if not (0 <= a.disconnect_fraction <= 1 and 0 <= a.stream_fraction <= 1):
        p.error("--disconnect-fraction and --stream-fraction must be in [0, 1]")
    if a.max_rss_growth_mb is not None and not a.pid:
        p.error("--max-rss-growth-mb needs --pid")
    if a.pid and not os.path.exists(f"/proc/{a.pid}"):
        p.error(f"--pid {a.pid}: no such process")
    if not a.base_url.startswith("http://"):
        p.error("--base-url must be http://host:port[/v1]")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        S = run(a)
    except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
        print(f"load_test.py: cannot talk to {a.base_url}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(asdict(S) | {"config": {k: v for k, v in vars(a).items() if k != "stop_at"}}, f, indent=2)
            f.write("\n")
    print(format_table(S, a), flush=True)
    return 0 if S.passed else 1


if __name__ == "__main__":
    sys.exit(main())
