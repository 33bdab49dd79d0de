"""A real OpenAI-compatible chat server on loopback that answers from a script (the edge of the
world in tests of `kernel-env generate`, `kernel-env eval` and the OpenHands plug-in).

::

    with ScriptedLLM(lambda request: Reply(content="<triton>...</triton>")) as llm:
        client = openai.OpenAI(base_url=llm.base_url, api_key="test")
        ...
        llm.requests   # every request body, in arrival order

The handler gets the request body (a dict: ``model``, ``messages``, ``tools``, ...) and returns
a ``Reply``; it is called from the server's threads, so a handler keeping state must lock.
``ScriptedLLM.sequence([...])`` answers with the replies in order. A handler that raises makes
the server answer HTTP 500 with the error, as a broken model server would (``Refused``: the
status it names). Each answer reports token usage estimated from the request's length.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One assistant message: text, optional reasoning (vLLM's ``reasoning_content``) and tool calls
    given as ``{"name": ..., "arguments": {...}}``."""

    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self, call_ids: Iterable[str]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call_id, "type": "function",
                 "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))}}
                for call_id, call in zip(call_ids, self.tool_calls)
            ]
        return message


class Refused(Exception):
    """Raised by a handler: the server answers HTTP ``status`` with this message (as vLLM refuses a
    request past the model's context, with 400)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def usage(request: dict, message: dict) -> dict:
    """Token counts as a server reports them, estimated at four characters a token: a longer
    conversation reports more prompt tokens, as a real one does."""
    prompt, completion = len(json.dumps(request.get("messages", []))) // 4, max(1, len(json.dumps(message)) // 4)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class ScriptedLLM:
    """Serves ``POST /v1/chat/completions`` and ``GET /v1/models`` on 127.0.0.1 (``port``; 0: a free
    one), and HTTP 404 anywhere else, as vLLM does (so an address without ``/v1`` is answered 404)."""

    def __init__(self, handler: Callable[[dict], Reply], *, model: str = "scripted-model", port: int = 0):
        self.handler = handler
        self.model = model
        self.requests: list[dict] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._make_handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-llm", daemon=True)

    @classmethod
    def sequence(cls, replies: Iterable[Reply | str], **options) -> ScriptedLLM:
        """Answer with ``replies`` in order (a str is a plain text reply); past the end, HTTP 500."""
        queue = iter(list(replies))
        lock = threading.Lock()

        def next_reply(_request: dict) -> Reply:
            with lock:
                reply = next(queue, None)
            if reply is None:
                raise RuntimeError("the script has no more replies")
            return Reply(content=reply) if isinstance(reply, str) else reply

        return cls(next_reply, **options)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> ScriptedLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _completion(self, request: dict) -> dict:
        reply = self.handler(request)
        with self._lock:
            number = next(self._ids)
        call_ids = [f"call_{number}_{i}" for i in range(len(reply.tool_calls))]
        return {
            "id": f"chatcmpl-{number}", "object": "chat.completion", "created": int(time.time()),
            "model": request.get("model") or self.model,
            "choices": [{"index": 0, "message": reply.message(call_ids),
                         "finish_reason": "tool_calls" if reply.tool_calls else "stop"}],
            "usage": usage(request, reply.message(call_ids)),
        }

    def _make_handler(self) -> type[BaseHTTPRequestHandler]:
        llm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest's output clean
                pass

            def _send(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": llm.model, "object": "model", "owned_by": "tests"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with llm._lock:
                    llm.requests.append(request)
                try:
                    self._send(200, llm._completion(request))
                except Refused as exc:
                    self._send(exc.status, {"error": {"message": str(exc), "type": "BadRequestError"}})
                except Exception as exc:  # noqa: BLE001 - a broken script is a broken server
                    self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}})

        return Handler
