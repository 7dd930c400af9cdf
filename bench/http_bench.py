#!/usr/bin/env python3
"""HTTP load benchmark for OpenAI-compatible servers (anna-serve, llama.cpp's
llama-server, vLLM, SGLang...).

Measures what vLLM's `bench serve` and SGLang's bench measure, with the
official `openai` client and asyncio only:

  TTFT  request sent -> first streamed chunk carrying text
  ITL   gaps between successive text-carrying chunks (all requests pooled)
  TPOT  (E2E - TTFT) / (output_tokens - 1), one value per request
  E2E   request sent -> last byte
  plus success/failure counts, wall time, requests/s, output tok/s, total tok/s.

Token counts come from the server's `usage` (stream_options.include_usage) when
it sends one; otherwise output tokens are the number of text-carrying chunks
(one token per chunk on llama.cpp, vLLM and anna-serve) and input tokens are
unknown, so total tok/s is reported as n/a.

Several --base-url flags run the same workload against each server in turn and
print a side-by-side table with ratios; --compare A.json B.json builds the same
table from saved --output files. See bench/notes/http-bench.md.

Exit status: 0 all requests succeeded, 1 some failed, 2 usage error,
130 interrupted (Ctrl-C prints the partial results first).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import math
import os
import platform
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

SCENARIOS = ("concurrent-short", "single-long", "mixed", "repeated-system", "random", "custom")
TOOL_NAME = "anna-http-bench"
JSON_VERSION = 1

# --------------------------------------------------------------------------
# Built-in prompt sets. They are deterministic so that two servers (or two
# runs) see byte-identical requests.

SHORT_PROMPTS = (
    "Write a haiku about autumn leaves.",
    "What is the capital of Australia? Answer in one sentence.",
    "Explain recursion to a ten-year-old in two sentences.",
    "Give three tips for writing readable C code.",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "What is the difference between a process and a thread?",
    "Write a Python function that reverses a string.",
    "Name four planets of the solar system and one fact about each.",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "Why is the sky blue? Keep it short.",
    "List five common HTTP status codes and their meaning.",
    "Suggest a name for a coffee shop run by robots.",
    "How many minutes are there in a week? Show the arithmetic.",
    "Write a limerick about a cat who learns to code.",
    "What does a hash table do, in one paragraph?",
    "Give a two-line description of the TCP three-way handshake.",
)

_LONG_SENTENCES = (
    "The harbour town of Velmora was founded by salt traders who arrived by river barge.",
    "Its first charter granted the guilds the right to elect a council of nine members.",
    "During the long winters the canals froze and the markets moved onto the ice.",
    "A fire in the old quarter destroyed the archive, so much of the early record is lost.",
    "The council rebuilt the archive in stone and required every guild to deposit copies of its ledgers.",
    "Trade in amber and dyed wool brought merchants from the southern kingdoms every spring.",
    "The lighthouse on the northern breakwater was lit with whale oil until the mines opened.",
    "When the coal seams were found in the hills, the population doubled within a generation.",
    "Workers from the mines formed a mutual aid society that later became the town's first bank.",
    "A railway reached Velmora late, and the barge operators fought its construction for a decade.",
    "The university began as a navigation school for pilots who guided ships through the shoals.",
    "Its library still holds the star charts drawn by the school's founder, a former smuggler.",
)

LONG_TASK = (
    "\n\nRead the history above. Then list, as numbered points, the three events "
    "that most changed the town's economy, with one sentence of justification each."
)

SYSTEM_POLICY_PARAGRAPHS = (
    "You are the support assistant of Northwind Hardware, an online shop for tools and garden equipment.",
    "Answer politely and concisely. Never invent order numbers, prices or delivery dates.",
    "Returns: unused items may be returned within 30 days of delivery with the original receipt. "
    "Power tools that were used may be returned only if they are faulty. Garden plants cannot be returned "
    "but are replaced once if they arrive damaged, when the customer sends a photo within 48 hours.",
    "Shipping: orders above 50 euros ship free within the country. Express delivery costs 9 euros and "
    "arrives the next working day when the order is placed before 14:00. Heavy items such as lawn mowers "
    "and ladders ship by freight and the carrier calls the customer to arrange a slot.",
    "Warranty: power tools carry a two-year warranty, hand tools a lifetime warranty against breakage "
    "in normal use. Batteries carry one year. The warranty does not cover wear parts such as blades, "
    "saw chains, drill bits and sanding pads.",
    "Payments: cards, bank transfer and invoice for registered business customers. Invoices are due "
    "in 14 days. Refunds go back to the original payment method within 5 working days of receiving "
    "the returned item.",
    "Escalation: if a customer reports an injury, a safety defect, or asks for a manager, apologise, "
    "do not discuss liability, and tell them a human colleague will call within one working day.",
    "Style: use short paragraphs, no more than five bullet points, and finish with one question "
    "that helps the customer move forward. Do not use emojis.",
)

REPEATED_SYSTEM_USERS = (
    "I bought a drill two weeks ago and it stopped working. What can I do?",
    "How much does express shipping cost and when would it arrive?",
    "Can I return a rose bush that arrived with broken stems?",
    "Does the warranty cover the chain of my chainsaw?",
    "I paid by card for a returned ladder. When do I get my money back?",
    "My ladder collapsed and I hurt my arm. I want to speak to a manager.",
    "Is shipping free for a 45 euro order?",
    "Can my company pay by invoice?",
)


@dataclass
class Prompt:
    """One request's input. `messages` is sent on the chat route; `text` on
    the completions route (the chat parts joined, so a shared system prompt is
    still a shared prefix there)."""

    kind: str
    messages: list[dict[str, str]]
    text: str
    token_ids: list[int] | None = None  # random scenario: sent as the completions prompt
    max_tokens: int | None = None       # per-request output length (random scenario)


def _mk_prompt(kind: str, user: str, system: str | None = None) -> Prompt:
    msgs = []
    if system:
        msgs.append({"role": "system", "content": system})
    msgs.append({"role": "user", "content": user})
    text = (system + "\n\n" + user) if system else user
    return Prompt(kind=kind, messages=msgs, text=text)


def long_text(n_chars: int) -> str:
    """Deterministic prose of about n_chars characters (~4 chars per token
    for English with BPE vocabularies)."""
    out: list[str] = []
    size = 0
    i = 0
    while size < n_chars:
        s = _LONG_SENTENCES[i % len(_LONG_SENTENCES)]
        if i >= len(_LONG_SENTENCES):
            # Vary repeats so that the text does not collapse into a loop the
            # model can trivially predict (that would change decode speed).
            s = f"In year {1200 + 7 * i} of the chronicle: " + s[0].lower() + s[1:]
        out.append(s)
        size += len(s) + 1
        i += 1
    return " ".join(out)


def system_policy(n_chars: int) -> str:
    base = " ".join(SYSTEM_POLICY_PARAGRAPHS)
    if len(base) >= n_chars:
        return base
    extra = long_text(n_chars - len(base))
    return base + "\n\nBackground on the shop's home town, for small talk only: " + extra


def load_prompt_file(path: str) -> list[Prompt]:
    """Custom prompts. `.json`: a list; `.jsonl`: one item per line; each item
    is a string, {"prompt": str}, {"system": str, "user": str} or
    {"messages": [...]}. Any other extension: one prompt per non-empty line."""
    with open(path, encoding="utf-8") as f:
        data = f.read()
    items: list[Any]
    if path.endswith(".json"):
        items = json.loads(data)
        if not isinstance(items, list):
            raise ValueError(f"{path}: expected a JSON list")
    elif path.endswith(".jsonl"):
        items = []
        for ln, line in enumerate(data.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{ln}: {e}") from None
    else:
        items = [line for line in data.splitlines() if line.strip()]
    out: list[Prompt] = []
    for i, it in enumerate(items):
        if isinstance(it, str):
            out.append(_mk_prompt("custom", it))
        elif isinstance(it, dict) and isinstance(it.get("messages"), list):
            msgs = it["messages"]
            if not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                       and isinstance(m.get("content"), str) for m in msgs) or not msgs:
                raise ValueError(f"{path}: item {i}: messages need role and string content")
            text = "\n\n".join(m["content"] for m in msgs)
            out.append(Prompt("custom", [dict(role=m["role"], content=m["content"]) for m in msgs], text))
        elif isinstance(it, dict) and isinstance(it.get("prompt"), str):
            out.append(_mk_prompt("custom", it["prompt"]))
        elif isinstance(it, dict) and isinstance(it.get("user"), str):
            sys_ = it.get("system")
            if sys_ is not None and not isinstance(sys_, str):
                raise ValueError(f"{path}: item {i}: system must be a string")
            out.append(_mk_prompt("custom", it["user"], sys_))
        else:
            raise ValueError(f"{path}: item {i}: expected a string, prompt, user or messages")
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def warmup_prompt(salt: str, i: int) -> Prompt:
    """Shares no text with the scenarios, so warm-up cannot prime a prefix
    cache for the timed requests."""
    tag = f"[warm-up {salt} {i}] " if salt else f"[warm-up {i}] "
    return _mk_prompt("warmup", tag + "Reply with the single word: ready.")


def apply_salt(prompts: list[Prompt], salt: str) -> list[Prompt]:
    """Prefix the first message of every prompt with one per-invocation tag.
    Prompt caches kept from an earlier run (llama.cpp keeps each slot's last
    prompt) then cannot serve this run, while prefixes shared inside the run
    (repeated-system) stay shared, and every server sees identical bytes."""
    if not salt:
        return prompts
    out = []
    for i, p in enumerate(prompts):
        if p.token_ids is not None:
            # token ids: the salt redraws the first few from the prompt's own ids (so they stay
            # within --token-range), a different prefix per run
            r = random.Random(f"{salt}-{i}")
            ids = list(p.token_ids)
            ids[:4] = [r.choice(p.token_ids) for _ in ids[:4]]
            out.append(Prompt(p.kind, [], "", token_ids=ids, max_tokens=p.max_tokens))
            continue
        msgs = [dict(m) for m in p.messages]
        msgs[0]["content"] = f"[run {salt}] " + msgs[0]["content"]
        out.append(Prompt(p.kind, msgs, f"[run {salt}] " + p.text))
    return out


def random_lengths(n: int, mean: int, range_ratio: float, rng: random.Random) -> list[int]:
    """vLLM's random dataset: lengths uniform over [mean * (1 - r), mean * (1 + r)], at least 1."""
    lo, hi = max(1, math.floor(mean * (1 - range_ratio))), max(1, math.ceil(mean * (1 + range_ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


def random_prompts(n: int, input_len: int, output_len: int, range_ratio: float, token_range: tuple[int, int],
                   seed: int) -> list[Prompt]:
    """vLLM's `--dataset-name random`: prompts of random token ids (sent as ids on the completions
    route, so every server sees exactly input_len tokens whatever its tokenizer) and a fixed
    output length per request (max_tokens, and min_tokens + ignore_eos when --fixed-output)."""
    rng = random.Random(seed)
    ins = random_lengths(n, input_len, range_ratio, rng)
    outs = random_lengths(n, output_len, range_ratio, rng)
    lo, hi = token_range
    out = []
    for i in range(n):
        ids = [rng.randrange(lo, hi) for _ in range(ins[i])]
        out.append(Prompt("random", [], "", token_ids=ids, max_tokens=outs[i]))
    return out


def build_prompts(scenario: str, n: int, long_chars: int, system_chars: int,
                  prompt_file: str | None, cfg: argparse.Namespace | None = None) -> list[Prompt]:
    """The n requests of a run, in submission order."""
    if scenario == "random":
        c = cfg
        if c is None:
            raise ValueError("--scenario random needs its options")
        return random_prompts(n, c.input_len, c.output_len, c.range_ratio, c.token_range,
                              c.seed if c.seed is not None else 0)
    if scenario == "custom":
        if not prompt_file:
            raise ValueError("--scenario custom needs --prompt-file")
        pool = load_prompt_file(prompt_file)
        return [pool[i % len(pool)] for i in range(n)]
    if scenario == "concurrent-short":
        return [_mk_prompt("short", SHORT_PROMPTS[i % len(SHORT_PROMPTS)]) for i in range(n)]
    if scenario == "single-long":
        return [_mk_prompt("long", long_text(long_chars) + LONG_TASK) for _ in range(n)]
    if scenario == "mixed":
        # One long request in four: enough to make long prefills stall short
        # requests on a server without chunked prefill, which is the point.
        out = []
        for i in range(n):
            if i % 4 == 3:
                out.append(_mk_prompt("long", long_text(long_chars) + LONG_TASK))
            else:
                out.append(_mk_prompt("short", SHORT_PROMPTS[i % len(SHORT_PROMPTS)]))
        return out
    if scenario == "repeated-system":
        sys_ = system_policy(system_chars)
        return [_mk_prompt("repeated-system", REPEATED_SYSTEM_USERS[i % len(REPEATED_SYSTEM_USERS)], sys_)
                for i in range(n)]
    raise ValueError(f"unknown scenario {scenario!r}")


# --------------------------------------------------------------------------
# Statistics


def percentile(sorted_vals: list[float], p: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), so the
    numbers match what vLLM's bench prints for the same samples."""
    if not sorted_vals:
        return math.nan
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    rank = (p / 100.0) * (len(sorted_vals) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(sorted_vals) - 1)
    frac = rank - lo
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * frac


def summarize(vals_s: list[float]) -> dict[str, Any]:
    """Seconds in, milliseconds out. Empty input gives n=0 and None values."""
    if not vals_s:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "min": None, "max": None}
    v = sorted(x * 1000.0 for x in vals_s)
    return {
        "n": len(v),
        "mean": sum(v) / len(v),
        "p50": percentile(v, 50),
        "p90": percentile(v, 90),
        "p99": percentile(v, 99),
        "min": v[0],
        "max": v[-1],
    }


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    """Send offsets in seconds: exponential gaps with mean 1/rate (a Poisson
    process), first request at 0. rate <= 0 or inf means all at once."""
    if rate <= 0 or math.isinf(rate):
        return [0.0] * n
    t = 0.0
    out = []
    for i in range(n):
        if i > 0:
            t += rng.expovariate(rate)
        out.append(t)
    return out


# --------------------------------------------------------------------------
# Requests


@dataclass
class RequestResult:
    index: int
    kind: str
    ok: bool = False
    cancelled: bool = False
    error: str | None = None
    sent_s: float | None = None       # offset from the start of the run
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    chunks: int = 0                   # text-carrying chunks
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    token_source: str = "none"        # usage | chunks | none
    finish_reason: str | None = None
    reconnects: int = 0               # keep-alive races retried (see _create)


def _chunk_text(choice: Any, route: str) -> str:
    if route == "completions":
        return getattr(choice, "text", None) or ""
    delta = getattr(choice, "delta", None)
    if delta is None:
        return ""
    parts = []
    for name in ("content", "reasoning_content", "reasoning"):
        v = getattr(delta, name, None)
        if isinstance(v, str):
            parts.append(v)
    for tc in getattr(delta, "tool_calls", None) or []:
        fn = getattr(tc, "function", None)
        args = getattr(fn, "arguments", None) if fn is not None else None
        if isinstance(args, str):
            parts.append(args)
        name = getattr(fn, "name", None) if fn is not None else None
        if isinstance(name, str):
            parts.append(name)
    return "".join(parts)


def _describe_error(e: BaseException) -> str:
    import openai

    if isinstance(e, openai.APITimeoutError):
        msg = "timeout"
    elif isinstance(e, openai.APIStatusError):
        body = getattr(e, "message", None) or str(e)
        msg = f"HTTP {e.status_code}: {body}"
    elif isinstance(e, openai.APIConnectionError):
        cause = e.__cause__ or e.__context__
        msg = f"connection error: {cause!r}" if cause else "connection error"
    else:
        msg = f"{type(e).__name__}: {e}"
    msg = " ".join(msg.split())
    return msg[:200]


def _request_kwargs(cfg: argparse.Namespace, model: str, prompt: Prompt) -> dict[str, Any]:
    mt = prompt.max_tokens or cfg.max_tokens
    kw: dict[str, Any] = {"model": model, "max_tokens": mt}
    if cfg.route == "chat":
        kw["messages"] = prompt.messages
    else:
        kw["prompt"] = prompt.token_ids if prompt.token_ids is not None else prompt.text
    if cfg.temperature is not None:
        kw["temperature"] = cfg.temperature
    if cfg.seed is not None:
        kw["seed"] = cfg.seed
    extra: dict[str, Any] = dict(cfg.extra_body or {})
    if cfg.top_k is not None:
        extra["top_k"] = cfg.top_k
    if cfg.ignore_eos:
        extra["ignore_eos"] = True
    if cfg.min_tokens is not None:
        extra["min_tokens"] = min(cfg.min_tokens, mt)
    if prompt.max_tokens and getattr(cfg, "fixed_output", False):
        extra["ignore_eos"] = True
        extra["min_tokens"] = mt
    if extra:
        kw["extra_body"] = extra
    if cfg.stream:
        kw["stream"] = True
        if cfg.usage:
            kw["stream_options"] = {"include_usage": True}
    return kw


async def _create(api: Any, kw: dict[str, Any], res: RequestResult) -> tuple[Any, float]:
    """POST once; retry once when the connection dropped before any response.
    llama.cpp's HTTP server closes a keep-alive connection after a few
    requests without saying so, and the client may already be writing the
    next request on it ("Server disconnected without sending a response").
    That is a transport race, not a server failure; retries of anything else
    stay off so that real failures are counted. Returns (response, send time)."""
    import openai

    t_send = time.perf_counter()
    try:
        return await api.create(**kw), t_send
    except openai.APIConnectionError as e:
        if isinstance(e, openai.APITimeoutError) or "without sending a response" not in repr(e.__cause__):
            raise
    res.reconnects += 1
    t_send = time.perf_counter()
    return await api.create(**kw), t_send


async def do_request(client: Any, cfg: argparse.Namespace, model: str, prompt: Prompt,
                     res: RequestResult, t0: float) -> None:
    """Fills `res`; never raises except CancelledError (the caller marks the
    result cancelled)."""
    kw = _request_kwargs(cfg, model, prompt)
    api = client.chat.completions if cfg.route == "chat" else client.completions
    t_send = time.perf_counter()
    res.sent_s = t_send - t0
    usage = None
    try:
        if cfg.stream:
            stream, t_send = await _create(api, kw, res)
            last = None
            try:
                async for chunk in stream:
                    now = time.perf_counter()
                    u = getattr(chunk, "usage", None)
                    if u is not None:
                        usage = u
                    for ch in getattr(chunk, "choices", None) or []:
                        if _chunk_text(ch, cfg.route):
                            if last is None:
                                res.ttft_s = now - t_send
                            else:
                                res.itl_s.append(now - last)
                            last = now
                            res.chunks += 1
                        fr = getattr(ch, "finish_reason", None)
                        if fr:
                            res.finish_reason = fr
            finally:
                await stream.close()
        else:
            resp, t_send = await _create(api, kw, res)
            usage = getattr(resp, "usage", None)
            choices = getattr(resp, "choices", None) or []
            if choices:
                res.finish_reason = getattr(choices[0], "finish_reason", None)
        res.e2e_s = time.perf_counter() - t_send
        ct = getattr(usage, "completion_tokens", None) if usage is not None else None
        pt = getattr(usage, "prompt_tokens", None) if usage is not None else None
        if isinstance(ct, int) and ct >= 0:
            res.output_tokens = ct
            res.token_source = "usage"
        elif cfg.stream:
            res.output_tokens = res.chunks
            res.token_source = "chunks"
        if isinstance(pt, int) and pt >= 0:
            res.prompt_tokens = pt
        res.ok = True
    except asyncio.CancelledError:
        res.e2e_s = time.perf_counter() - t_send
        raise
    except Exception as e:  # a failed request is data, not a crash
        res.e2e_s = time.perf_counter() - t_send
        res.error = _describe_error(e)


def make_client(base_url: str, timeout: float, max_retries: int) -> Any:
    import openai

    api_key = os.environ.get("OPENAI_API_KEY") or "sk-no-key"
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout,
                              max_retries=max_retries)


def normalize_base_url(u: str) -> str:
    """Accept http://host:port as well as http://host:port/v1."""
    u = u.rstrip("/")
    if not u.endswith("/v1"):
        u += "/v1"
    return u


async def resolve_model(client: Any, model: str | None) -> str:
    if model:
        return model
    page = await client.models.list()
    data = getattr(page, "data", None) or []
    if not data:
        raise RuntimeError("--model not given and GET /v1/models returned no model")
    return data[0].id


@dataclass
class RunOutcome:
    results: list[RequestResult]
    wall_s: float
    interrupted: bool
    model: str
    base_url: str
    label: str
    warmup_errors: list[str]
    round: int = 1
    salt: str = ""


async def run_target(cfg: argparse.Namespace, base_url: str, model: str | None, label: str,
                     prompts: list[Prompt], stop: asyncio.Event, salt: str = "") -> RunOutcome:
    client = make_client(base_url, cfg.timeout, cfg.max_retries)
    results = [RequestResult(index=i, kind=p.kind) for i, p in enumerate(prompts)]
    warm_errs: list[str] = []
    try:
        model = await resolve_model(client, model)
        # Warm-up requests are excluded from every figure: they absorb lazy
        # allocations, page-faulting the weights in, and first-use JIT.
        for i in range(cfg.warmup):
            if stop.is_set():
                break
            w = RequestResult(index=-1, kind="warmup")
            wp = warmup_prompt(salt, i)
            wt = asyncio.ensure_future(do_request(client, cfg, model, wp, w, time.perf_counter()))
            st = asyncio.ensure_future(stop.wait())
            await asyncio.wait({wt, st}, return_when=asyncio.FIRST_COMPLETED)
            st.cancel()
            if not wt.done():
                wt.cancel()
                await asyncio.gather(wt, return_exceptions=True)
                break
            if not w.ok:
                warm_errs.append(w.error or "unknown")
        rng = random.Random(cfg.seed if cfg.seed is not None else 0)
        arrivals = poisson_arrivals(len(prompts), cfg.request_rate, rng)
        sem = asyncio.Semaphore(cfg.concurrency)
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            delay = t0 + arrivals[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                await do_request(client, cfg, model, prompts[i], results[i], t0)

        tasks = [asyncio.ensure_future(one(i)) for i in range(len(prompts))]
        stopper = asyncio.ensure_future(stop.wait())
        pending = set(tasks)
        interrupted = stop.is_set()
        while pending and not interrupted:
            done, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            if stopper in done:
                interrupted = True
            pending.discard(stopper)
        wall = time.perf_counter() - t0
        if interrupted:
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for t, r in zip(tasks, results):
                if not r.ok and r.error is None:
                    r.cancelled = True
        stopper.cancel()
        return RunOutcome(results, wall, interrupted, model, base_url, label, warm_errs)
    finally:
        try:
            await client.close()
        except Exception:
            pass


# --------------------------------------------------------------------------
# Reporting


def build_summary(cfg: argparse.Namespace, out: RunOutcome, per_request: bool) -> dict[str, Any]:
    rs = out.results
    ok = [r for r in rs if r.ok]
    failed = [r for r in rs if not r.ok and not r.cancelled]
    cancelled = [r for r in rs if r.cancelled]
    wall = out.wall_s if out.wall_s > 0 else math.nan
    out_known = [r for r in ok if r.output_tokens is not None]
    out_tok = sum(r.output_tokens for r in out_known)  # type: ignore[misc]
    in_known = [r for r in ok if r.prompt_tokens is not None]
    in_tok = sum(r.prompt_tokens for r in in_known)  # type: ignore[misc]
    sources = sorted({r.token_source for r in ok})
    tpot = []
    for r in ok:
        if r.ttft_s is not None and r.output_tokens is not None and r.output_tokens > 1 and r.e2e_s:
            tpot.append((r.e2e_s - r.ttft_s) / (r.output_tokens - 1))
    itl = [x for r in ok for x in r.itl_s]
    errors: dict[str, int] = {}
    for r in failed:
        errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    all_out_known = bool(ok) and len(out_known) == len(ok)
    all_in_known = bool(ok) and len(in_known) == len(ok)
    s: dict[str, Any] = {
        "tool": TOOL_NAME,
        "version": JSON_VERSION,
        "label": out.label,
        "round": out.round,
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "base_url": out.base_url,
        "model": out.model,
        "config": {
            "route": cfg.route,
            "scenario": cfg.scenario,
            "prompt_file": cfg.prompt_file,
            "requests": cfg.requests,
            "concurrency": cfg.concurrency,
            "max_tokens": cfg.max_tokens,
            "stream": cfg.stream,
            "include_usage": bool(cfg.stream and cfg.usage),
            "request_rate": None if math.isinf(cfg.request_rate) else cfg.request_rate,
            "temperature": cfg.temperature,
            "top_k": cfg.top_k,
            "seed": cfg.seed,
            "ignore_eos": cfg.ignore_eos,
            "min_tokens": cfg.min_tokens,
            "input_len": cfg.input_len if cfg.scenario == "random" else None,
            "output_len": cfg.output_len if cfg.scenario == "random" else None,
            "range_ratio": cfg.range_ratio if cfg.scenario == "random" else None,
            "fixed_output": cfg.fixed_output if cfg.scenario == "random" else None,
            "warmup": cfg.warmup,
            "timeout_s": cfg.timeout,
            "long_chars": cfg.long_chars,
            "system_chars": cfg.system_chars,
            "salt": out.salt,
            "rounds": cfg.rounds,
            "extra_body": cfg.extra_body,
        },
        "interrupted": out.interrupted,
        "counts": {
            "requests": len(rs),
            "successful": len(ok),
            "failed": len(failed),
            "cancelled": len(cancelled),
            "not_started": sum(1 for r in rs if r.sent_s is None),
            # Streaming: no text at all (a usage count of 1 can be a bare EOS).
            "empty_outputs": sum(1 for r in ok if (r.chunks == 0 if cfg.stream else r.output_tokens == 0)),
            "finish_length": sum(1 for r in ok if r.finish_reason == "length"),
            "reconnects": sum(r.reconnects for r in rs),
        },
        "wall_s": out.wall_s,
        "requests_per_s": len(ok) / wall if ok else 0.0,
        "input_tokens": in_tok if all_in_known else None,
        "output_tokens": out_tok if all_out_known else None,
        "token_count_source": "+".join(sources) if sources else "none",
        "output_tok_per_s": out_tok / wall if all_out_known else None,
        "total_tok_per_s": (in_tok + out_tok) / wall if (all_in_known and all_out_known) else None,
        "ttft_ms": summarize([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_ms": summarize(itl),
        "tpot_ms": summarize(tpot),
        "e2e_ms": summarize([r.e2e_s for r in ok if r.e2e_s is not None]),
        "errors": [{"message": m, "count": c} for m, c in sorted(errors.items(), key=lambda kv: -kv[1])],
        "warmup_errors": out.warmup_errors,
    }
    for k in ("wall_s", "requests_per_s"):
        if isinstance(s[k], float) and math.isnan(s[k]):
            s[k] = None
    if per_request:
        s["per_request"] = [asdict(r) for r in rs]
    return s


def _fmt(v: Any, nd: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def format_text(s: dict[str, Any]) -> str:
    c = s["config"]
    n = s["counts"]
    rate = "all-at-once" if c["request_rate"] is None else f"{c['request_rate']:g}/s Poisson"
    rnd = f" (round {s['round']}/{c['rounds']})" if c.get("rounds", 1) > 1 else ""
    lines = [
        f"== {s['label']}{rnd}: {s['base_url']}  model={s['model']}",
        f"scenario={c['scenario']} route={c['route']} stream={'on' if c['stream'] else 'off'} "
        f"requests={c['requests']} concurrency={c['concurrency']} max_tokens={c['max_tokens']} "
        f"arrivals={rate} warmup={c['warmup']}",
    ]
    if s["interrupted"]:
        lines.append("INTERRUPTED: partial results (cancelled requests are excluded)")
    lines += [
        f"successful: {n['successful']}  failed: {n['failed']}  cancelled: {n['cancelled']}  "
        f"not started: {n['not_started']}  empty: {n['empty_outputs']}  hit max_tokens: {n['finish_length']}  "
        f"reconnects: {n.get('reconnects', 0)}",
        f"wall time s:    {_fmt(s['wall_s'], 3)}",
        f"requests/s:     {_fmt(s['requests_per_s'], 3)}",
        f"output tok/s:   {_fmt(s['output_tok_per_s'])}",
        f"total tok/s:    {_fmt(s['total_tok_per_s'])}",
        f"tokens in/out:  {_fmt(s['input_tokens'])} / {_fmt(s['output_tokens'])} "
        f"(counted from: {s['token_count_source']})",
        f"{'ms':<6}{'n':>6}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'min':>10}{'max':>10}",
    ]
    for key, name in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
        m = s[key]
        lines.append(f"{name:<6}{m['n']:>6}" + "".join(f"{_fmt(m[q]):>10}" for q in
                                                      ("mean", "p50", "p90", "p99", "min", "max")))
    if not c["stream"]:
        lines.append("(no streaming: TTFT, ITL and TPOT need --stream)")
    for e in s["errors"][:5]:
        lines.append(f"error x{e['count']}: {e['message']}")
    if len(s["errors"]) > 5:
        lines.append(f"... {len(s['errors']) - 5} more distinct errors")
    for e in s["warmup_errors"]:
        lines.append(f"warm-up error: {e}")
    return "\n".join(lines)


# (row name, getter, higher_is_better)
_COMPARE_ROWS = (
    ("successful requests", lambda s: s["counts"]["successful"], True),
    ("failed requests", lambda s: s["counts"]["failed"], False),
    ("wall time s", lambda s: s["wall_s"], False),
    ("requests/s", lambda s: s["requests_per_s"], True),
    ("output tok/s", lambda s: s["output_tok_per_s"], True),
    ("total tok/s", lambda s: s["total_tok_per_s"], True),
    ("output tokens", lambda s: s["output_tokens"], None),
    ("TTFT p50 ms", lambda s: s["ttft_ms"]["p50"], False),
    ("TTFT p99 ms", lambda s: s["ttft_ms"]["p99"], False),
    ("ITL p50 ms", lambda s: s["itl_ms"]["p50"], False),
    ("ITL p99 ms", lambda s: s["itl_ms"]["p99"], False),
    ("TPOT p50 ms", lambda s: s["tpot_ms"]["p50"], False),
    ("TPOT p99 ms", lambda s: s["tpot_ms"]["p99"], False),
    ("E2E p50 ms", lambda s: s["e2e_ms"]["p50"], False),
    ("E2E p99 ms", lambda s: s["e2e_ms"]["p99"], False),
)

_CONFIG_KEYS = ("route", "scenario", "requests", "concurrency", "max_tokens", "stream",
                "request_rate", "temperature", "ignore_eos", "long_chars", "system_chars")


def _median(vals: list[Any]) -> Any:
    v = sorted(x for x in vals if isinstance(x, (int, float)))
    if not v:
        return None
    if len(v) % 2:
        return v[len(v) // 2]
    return (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def format_compare(summaries: list[dict[str, Any]]) -> str:
    """Markdown table, one column per label, plus `<last>/<first>` ratios: the
    first label is the baseline (put the peer first, anna last). Several
    summaries with one label (--rounds) are reduced to the median of each
    figure, which is what makes alternating rounds robust to load spikes."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for i, s in enumerate(summaries):
        groups.setdefault(s.get("label") or f"run{i}", []).append(s)
    labels = list(groups)
    nrounds = {len(g) for g in groups.values()}
    head = ["figure"] + [lb if len(groups[lb]) == 1 else f"{lb} (median of {len(groups[lb])})" for lb in labels]
    ratio = len(labels) >= 2
    if ratio:
        head.append(f"{labels[-1]}/{labels[0]}")
    lines = []
    base = summaries[0].get("config", {})
    diffs = [k for k in _CONFIG_KEYS for s in summaries[1:] if s.get("config", {}).get(k) != base.get(k)]
    c = base
    lines.append(f"workload: scenario={c.get('scenario')} route={c.get('route')} "
                 f"stream={c.get('stream')} requests={c.get('requests')} "
                 f"concurrency={c.get('concurrency')} max_tokens={c.get('max_tokens')} "
                 f"request_rate={c.get('request_rate') or 'all-at-once'}")
    if diffs:
        lines.append("WARNING: runs differ in " + ", ".join(sorted(set(diffs))) + "; ratios are not like for like")
    if len(nrounds) > 1:
        lines.append("WARNING: labels have different numbers of rounds")
    if any(s.get("interrupted") for s in summaries):
        lines.append("WARNING: some runs were interrupted; their figures are partial")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for name, get, _hib in _COMPARE_ROWS:
        vals = []
        for lb in labels:
            per = []
            for s in groups[lb]:
                try:
                    per.append(get(s))
                except (KeyError, TypeError):
                    per.append(None)
            vals.append(_median(per))
        row = [name] + [_fmt(v) for v in vals]
        if ratio:
            a, b = vals[0], vals[-1]
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
                row.append(f"{b / a:.2f}")
            else:
                row.append("n/a")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="http_bench.py",
        description="Load benchmark for OpenAI-compatible HTTP servers (TTFT, ITL, TPOT, E2E, throughput).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base-url", action="append", default=None,
                   help="server URL, e.g. http://127.0.0.1:8091 (/v1 added if missing); "
                        "repeat to run the same workload on several servers and print a side-by-side table "
                        "(default http://127.0.0.1:8080)")
    p.add_argument("--model", action="append", default=None,
                   help="model id for the request body; one per --base-url or one for all "
                        "(default: the first id from GET /v1/models)")
    p.add_argument("--label", action="append", default=None,
                   help="name of each --base-url in tables and JSON (default: host:port)")
    p.add_argument("--route", choices=("chat", "completions"), default=None, dest="route_given",
                   help="/v1/chat/completions or /v1/completions (default chat; random: completions)")
    p.add_argument("--scenario", choices=SCENARIOS, default="concurrent-short")
    p.add_argument("--prompt-file", help="prompts for --scenario custom (.json list, .jsonl, or one per line)")
    p.add_argument("--requests", type=int, default=16, help="timed requests (warm-up not counted)")
    p.add_argument("--concurrency", default="4",
                   help="most requests in flight at once; a comma list (1,16,64,256) runs each level in turn "
                        "and ends with one table row per level and server")
    p.add_argument("--max-tokens", type=int, default=64, help="output cap per request")
    p.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True,
                   help="stream responses (needed for TTFT, ITL, TPOT)")
    p.add_argument("--usage", action=argparse.BooleanOptionalAction, default=True,
                   help="send stream_options.include_usage when streaming")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="mean arrivals per second (Poisson); inf = all at once")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None, help="sent as the top_k extension field")
    p.add_argument("--seed", type=int, default=None,
                   help="sent as the request seed; also seeds the Poisson arrivals (0 when unset)")
    p.add_argument("--input-len", type=int, default=1024, help="--scenario random: mean prompt tokens")
    p.add_argument("--output-len", type=int, default=128, help="--scenario random: mean output tokens")
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="--scenario random: lengths uniform in [len * (1 - r), len * (1 + r)] (vLLM's "
                        "--random-range-ratio; 0 = fixed lengths, 0.75 = the mixed set)")
    p.add_argument("--token-range", default="100:1000", metavar="LO:HI",
                   help="--scenario random: prompt token ids drawn from [LO, HI); keep HI within every "
                        "compared model's vocabulary and below its special tokens")
    p.add_argument("--fixed-output", action=argparse.BooleanOptionalAction, default=True,
                   help="--scenario random: send ignore_eos and min_tokens = max_tokens, so random-weight "
                        "models make exactly the drawn output length")
    p.add_argument("--min-tokens", type=int, default=None,
                   help="sent as min_tokens (vLLM, anna-serve): no end-of-generation before this many tokens")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos=true (llama.cpp, vLLM) so every request makes max_tokens tokens")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed requests sent one by one first (their prompt shares no prefix with the run)")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the run, alternating servers each round; tables show the median per figure")
    p.add_argument("--salt", default="auto",
                   help="tag prefixed to every prompt so caches from earlier runs do not hit: "
                        "'auto' = random per invocation (same for every server), 'none', or a fixed string")
    p.add_argument("--extra-body", type=json.loads, default=None, metavar="JSON",
                   help='extra request fields, e.g. \'{"cache_prompt": false}\' for llama.cpp')
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, seconds")
    p.add_argument("--max-retries", type=int, default=0,
                   help="client retries on 429/5xx/connection errors; 0 so failures are counted, not hidden")
    p.add_argument("--long-chars", type=int, default=2400,
                   help="length of the long prompt in characters (~4 per token)")
    p.add_argument("--system-chars", type=int, default=2400,
                   help="length of the repeated system prompt in characters")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of text")
    p.add_argument("--output", help="also write the JSON summary (a list when several servers) to this file")
    p.add_argument("--per-request", action="store_true", help="include per-request records in the JSON")
    p.add_argument("--output-partial", action="store_true",
                   help="rewrite --output after every run, so a run killed by a deadline leaves what it measured")
    p.add_argument("--compare", nargs="+", metavar="JSON",
                   help="print the side-by-side table from saved --output files and exit (first = baseline)")
    a = p.parse_args(argv)
    a.route = a.route_given or "chat"
    if a.compare:
        return a
    try:
        a.concurrency_levels = [int(x) for x in str(a.concurrency).split(",")]
    except ValueError:
        p.error(f"--concurrency {a.concurrency!r}: expected an integer or a comma list of integers")
    if any(c < 1 for c in a.concurrency_levels):
        p.error("--concurrency levels must be >= 1")
    a.concurrency = a.concurrency_levels[0]
    if a.scenario == "random":
        if a.input_len < 1 or a.output_len < 1:
            p.error("--input-len and --output-len must be >= 1")
        if not 0 <= a.range_ratio < 1:
            p.error("--range-ratio must be in [0, 1)")
        try:
            lo, hi = (int(x) for x in a.token_range.split(":"))
        except ValueError:
            p.error(f"--token-range {a.token_range!r}: expected LO:HI")
        if not 0 <= lo < hi:
            p.error("--token-range needs 0 <= LO < HI")
        a.token_range = (lo, hi)
        if a.route_given == "chat":
            p.error("--scenario random sends token ids: it runs on --route completions")
        a.route = "completions"
    if a.output_partial and not a.output:
        p.error("--output-partial needs --output")
    if a.min_tokens is not None and a.min_tokens < 0:
        p.error("--min-tokens must be >= 0")
    if a.requests < 1 or a.max_tokens < 1 or a.warmup < 0 or a.rounds < 1:
        p.error("--requests, --concurrency, --max-tokens and --rounds must be >= 1, --warmup >= 0")
    if a.request_rate <= 0 or math.isnan(a.request_rate):
        p.error("--request-rate must be > 0 (inf = all at once)")
    if a.timeout <= 0 or a.long_chars < 0 or a.system_chars < 0 or a.max_retries < 0:
        p.error("--timeout must be > 0; --long-chars, --system-chars, --max-retries >= 0")
    if a.scenario == "custom" and not a.prompt_file:
        p.error("--scenario custom needs --prompt-file")
    if a.extra_body is not None and not isinstance(a.extra_body, dict):
        p.error("--extra-body must be a JSON object")
    if a.salt == "auto":
        a.salt = "%08x" % random.SystemRandom().getrandbits(32)
    elif a.salt == "none":
        a.salt = ""
    a.base_url = a.base_url or ["http://127.0.0.1:8080"]
    n = len(a.base_url)
    if a.model and len(a.model) not in (1, n):
        p.error("give --model once, or once per --base-url")
    if a.label and len(a.label) != n:
        p.error("give --label once per --base-url")
    return a


def _default_label(url: str) -> str:
    u = url.split("://", 1)[-1]
    return u.split("/", 1)[0]


def load_summaries(paths: list[str]) -> list[dict[str, Any]]:
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        items = d if isinstance(d, list) else [d]
        for it in items:
            if not isinstance(it, dict) or it.get("tool") != TOOL_NAME:
                raise ValueError(f"{path}: not an {TOOL_NAME} summary")
            if not it.get("label"):
                it["label"] = os.path.splitext(os.path.basename(path))[0]
            out.append(it)
    return out


async def amain(a: argparse.Namespace) -> tuple[list[dict[str, Any]], bool]:
    base_prompts = build_prompts(a.scenario, a.requests, a.long_chars, a.system_chars, a.prompt_file, a)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = False
    try:
        # First Ctrl-C: stop, report what finished. Second: default behaviour.
        def on_sigint() -> None:
            stop.set()
            loop.remove_signal_handler(signal.SIGINT)
            print("\ninterrupted: cancelling in-flight requests, printing partial results "
                  "(Ctrl-C again to abort)", file=sys.stderr)
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):
        pass
    summaries = []
    try:
        # Rounds alternate the servers (A B A B ...) so that a burst of
        # background load hits both rather than one; each round has its own
        # salt so that a round cannot reuse the previous round's cached prompts.
        for rnd in range(1, a.rounds + 1):
            for conc in a.concurrency_levels:
                salt = a.salt if (a.rounds == 1 or not a.salt) else f"{a.salt}-r{rnd}"
                if len(a.concurrency_levels) > 1 and salt:
                    salt = f"{salt}-c{conc}"  # a level must not reuse the previous level's cached prompts
                prompts = apply_salt(base_prompts, salt)
                cfg = argparse.Namespace(**vars(a))
                cfg.concurrency = conc
                for i, url in enumerate(a.base_url):
                    if stop.is_set():
                        break
                    model = (a.model[i] if len(a.model) > 1 else a.model[0]) if a.model else None
                    label = a.label[i] if a.label else _default_label(url)
                    try:
                        out = await run_target(cfg, normalize_base_url(url), model, label, prompts, stop, salt)
                    except Exception as e:  # e.g. server down while listing models
                        print(f"{label}: {_describe_error(e)}", file=sys.stderr)
                        res = [RequestResult(index=j, kind=p.kind, error=_describe_error(e))
                               for j, p in enumerate(prompts)]
                        out = RunOutcome(res, 0.0, False, model or "?", normalize_base_url(url), label, [])
                    out.round, out.salt = rnd, salt
                    summaries.append(build_summary(cfg, out, a.per_request))
                    if a.output_partial:
                        write_output(a.output, summaries)
                if not a.json and summaries:
                    print(format_text(summaries[-1]), flush=True)
                    print(flush=True)
    finally:
        if installed:
            try:
                loop.remove_signal_handler(signal.SIGINT)
            except Exception:
                pass
    return summaries, stop.is_set()


def write_output(path: str, summaries: list[dict[str, Any]]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(summaries[0] if len(summaries) == 1 else summaries, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _levels(summaries: list[dict[str, Any]]) -> list[Any]:
    return sorted({s.get("config", {}).get("concurrency") for s in summaries}, key=lambda c: (c is None, c))


def format_sweep(summaries: list[dict[str, Any]]) -> str:
    """Markdown, one row per concurrency level and server (median over rounds): what the
    serving tables of bench/RESULTS.md show."""
    groups: dict[tuple[Any, str], list[dict[str, Any]]] = {}
    for i, s in enumerate(summaries):
        groups.setdefault((s.get("config", {}).get("concurrency"), s.get("label") or f"run{i}"), []).append(s)
    c = summaries[0].get("config", {})
    reqs = sorted({s.get("config", {}).get("requests") for s in summaries}, key=lambda x: (str(type(x)), x or 0))
    wl = f"scenario={c.get('scenario')} route={c.get('route')} requests={'/'.join(map(str, reqs))}"
    if c.get("scenario") == "random":
        wl += f" input_len={c.get('input_len')} output_len={c.get('output_len')} range_ratio={c.get('range_ratio')}"
    else:
        wl += f" max_tokens={c.get('max_tokens')}"
    lines = ["workload: " + wl,
             "| concurrency | server | ok | failed | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | "
             "ITL p99 ms | TPOT p50 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    gets = (lambda s: s["counts"]["successful"], lambda s: s["counts"]["failed"], lambda s: s["output_tok_per_s"],
            lambda s: s["ttft_ms"]["p50"], lambda s: s["ttft_ms"]["p99"], lambda s: s["itl_ms"]["p50"],
            lambda s: s["itl_ms"]["p99"], lambda s: s["tpot_ms"]["p50"])
    for lvl in _levels(summaries):
        for (cl, label), ss in groups.items():
            if cl != lvl:
                continue
            vals = []
            for g in gets:
                per = []
                for s in ss:
                    try:
                        per.append(g(s))
                    except (KeyError, TypeError):
                        per.append(None)
                vals.append(_fmt(_median(per)))
            lines.append(f"| {lvl} | {label} | " + " | ".join(vals) + " |")
    if any(s.get("interrupted") for s in summaries):
        lines.append("WARNING: some runs were interrupted; their figures are partial")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.compare:
        try:
            ss = load_summaries(a.compare)
        except (OSError, ValueError) as e:
            print(f"http_bench.py: {e}", file=sys.stderr)
            return 2
        print(format_sweep(ss) if len(_levels(ss)) > 1 else format_compare(ss))
        return 0
    try:
        import openai  # noqa: F401
    except ImportError:
        print("http_bench.py: needs the openai package (python3 -m pip install openai)", file=sys.stderr)
        return 2
    try:
        summaries, interrupted = asyncio.run(amain(a))
    except (ValueError, OSError) as e:
        print(f"http_bench.py: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return 130
    if not summaries:
        print("http_bench.py: interrupted before any run", file=sys.stderr)
        return 130
    if a.json:
        print(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2))
    elif len(_levels(summaries)) > 1:
        print(format_sweep(summaries))
    elif len(summaries) > 1:
        print(format_compare(summaries))
    if a.output:
        write_output(a.output, summaries)
    if interrupted:
        return 130
    return 0 if all(s["counts"]["failed"] == 0 for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
