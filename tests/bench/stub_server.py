"""A tiny OpenAI-compatible HTTP server with scripted timing, for testing
bench/http_bench.py without a model. Standard library only.

It speaks just enough HTTP/1.1 (keep-alive, Content-Length bodies, chunked
SSE responses) for the official `openai` client. Every response is shaped
like SERVING.md describes; timing is controlled so that tests can check the
bench's TTFT/ITL/TPOT arithmetic against known delays.

Run by hand: python3 tests/bench/stub_server.py --port 8093
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StubConfig:
    ttft: float = 0.02            # delay before the first token
    itl: float = 0.005            # delay between tokens
    tokens: int = 8               # tokens generated when max_tokens allows
    usage: bool = True            # honour stream_options.include_usage / send usage
    fail_every: int = 0           # every Nth completion request answers HTTP 500
    stall_s: float = 0.0          # sleep this long before answering (timeouts)
    tokens_per_chunk: int = 1     # >1 imitates servers that batch tokens per chunk
    drop_call: int = 0            # Nth completion request: close the socket, no response
    cut_after: int = 0            # streams: close the socket after this many tokens
    garbage_sse: bool = False     # streams: one event that is not JSON
    model: str = "stub-model"


@dataclass
class StubState:
    requests: list[dict[str, Any]] = field(default_factory=list)
    completion_calls: int = 0


class StubServer:
    """Start with start() (returns the base URL), stop with stop()."""

    def __init__(self, cfg: StubConfig | None = None, port: int = 0) -> None:
        self.cfg = cfg or StubConfig()
        self.state = StubState()
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.AbstractServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.base_url = ""

    # ---- lifecycle

    def start(self) -> str:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("stub server did not start")
        return self.base_url

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self._port))
        port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            # Idle keep-alive handlers are still parked in readline().
            pending = asyncio.all_tasks(self._loop)
            for t in pending:
                t.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.close()

    # ---- HTTP

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                parts = line.decode("latin-1").split()
                if len(parts) < 2:
                    break
                method, path = parts[0], parts[1]
                headers: dict[str, str] = {}
                while True:
                    h = await reader.readline()
                    if h in (b"\r\n", b"\n", b""):
                        break
                    k, _, v = h.decode("latin-1").partition(":")
                    headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0") or 0)
                body = await reader.readexactly(n) if n else b""
                await self._route(method, path, body, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # cancelled = stop() shutting the loop down; nothing to report
        finally:
            try:
                writer.close()
            except Exception:
                pass

    async def _send_json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}.get(status, "X")
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        await writer.drain()

    async def _route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        path = path.split("?", 1)[0]
        if method == "GET" and path == "/v1/models":
            await self._send_json(writer, 200, {"object": "list", "data": [
                {"id": self.cfg.model, "object": "model", "created": 0, "owned_by": "stub"}]})
            return
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            await self._send_json(writer, 404, {"error": {"message": "not found", "type": "not_found",
                                                          "param": None, "code": 404}})
            return
        try:
            req = json.loads(body or b"{}")
        except json.JSONDecodeError:
            await self._send_json(writer, 400, {"error": {"message": "bad json", "type": "invalid_request_error",
                                                          "param": None, "code": 400}})
            return
        self.state.requests.append(req)
        self.state.completion_calls += 1
        if self.cfg.drop_call and self.state.completion_calls == self.cfg.drop_call:
            # What a keep-alive close race looks like to the client.
            raise ConnectionResetError("scripted drop")
        if self.cfg.stall_s:
            await asyncio.sleep(self.cfg.stall_s)
        if self.cfg.fail_every and self.state.completion_calls % self.cfg.fail_every == 0:
            await self._send_json(writer, 500, {"error": {"message": "scripted failure", "type": "server_error",
                                                          "param": None, "code": 500}})
            return
        chat = path.endswith("chat/completions")
        await self._complete(req, chat, writer)

    async def _complete(self, req: dict[str, Any], chat: bool, writer: asyncio.StreamWriter) -> None:
        cfg = self.cfg
        max_tokens = req.get("max_tokens") or req.get("max_completion_tokens") or cfg.tokens
        n_out = cfg.tokens if req.get("ignore_eos") is None else max_tokens
        n_out = min(int(max_tokens), n_out)
        finish = "length" if n_out >= int(max_tokens) else "stop"
        if chat:
            text_in = " ".join(str(m.get("content", "")) for m in req.get("messages", []))
        else:
            text_in = str(req.get("prompt", ""))
        n_in = max(1, len(text_in.split()))
        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        rid, created = "cmpl-stub", int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not req.get("stream"):
            await asyncio.sleep(cfg.ttft + cfg.itl * max(0, n_out - 1))
            text = "".join(f"t{i} " for i in range(n_out))
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            out = {"id": rid, "object": obj, "created": created, "model": cfg.model, "choices": [choice]}
            if cfg.usage:
                out["usage"] = usage
            await self._send_json(writer, 200, out)
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")

        async def event(payload: Any) -> None:
            data = b"data: " + (payload if isinstance(payload, bytes) else json.dumps(payload).encode()) + b"\n\n"
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        def chunk(delta_text: str | None, fin: str | None, first: bool = False) -> dict[str, Any]:
            if chat:
                delta: dict[str, Any] = {}
                if first:
                    delta["role"] = "assistant"
                if delta_text is not None:
                    delta["content"] = delta_text
                ch: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": fin}
            else:
                ch = {"index": 0, "text": delta_text or "", "finish_reason": fin}
            return {"id": rid, "object": obj + ".chunk" if chat else obj, "created": created,
                    "model": cfg.model, "choices": [ch], "usage": None}

        if chat:
            await event(chunk(None, None, first=True))  # role-only chunk: must not count as a token
        await asyncio.sleep(cfg.ttft)
        i = 0
        while i < n_out:
            k = min(cfg.tokens_per_chunk, n_out - i)
            if i:
                await asyncio.sleep(cfg.itl)
            await event(chunk("".join(f"t{j} " for j in range(i, i + k)), None))
            i += k
            if cfg.cut_after and i >= cfg.cut_after:
                raise ConnectionResetError("scripted cut")
            if cfg.garbage_sse and i == 1:
                await event(b"{not json")
        await event(chunk(None if chat else "", finish))
        opts = req.get("stream_options") or {}
        if cfg.usage and opts.get("include_usage"):
            await event({"id": rid, "object": obj + ".chunk" if chat else obj, "created": created,
                         "model": cfg.model, "choices": [], "usage": usage})
        await event(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8093)
    p.add_argument("--ttft", type=float, default=0.05)
    p.add_argument("--itl", type=float, default=0.02)
    p.add_argument("--tokens", type=int, default=32)
    a = p.parse_args()
    s = StubServer(StubConfig(ttft=a.ttft, itl=a.itl, tokens=a.tokens), port=a.port)
    print(s.start(), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        s.stop()


if __name__ == "__main__":
    main()
