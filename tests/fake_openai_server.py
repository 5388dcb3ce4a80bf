"""A real HTTP server on loopback that speaks OpenAI chat-completions the way vLLM does.

Only the model is scripted: each POST /v1/chat/completions pops the next scripted answer.
The protocol is checked as vLLM checks it: the served model name, ``messages``, streaming
(refused here: the client must not stream), the structured-output fields (``response_format``
with a ``json_schema.schema``, ``structured_outputs.json`` or legacy ``guided_json``) and the
bearer key. Answers can be slow, errors, truncated (``finish_reason: "length"``) or garbage.

    with FakeOpenAIServer(model="m") as srv:
        srv.script(Answer(content='{"priors": []}'))
        client = ChatClient(srv.base_url, "m")
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    """One scripted reply. ``status`` != 200 sends an OpenAI-style error body; ``raw`` sends
    these bytes as the body verbatim (a broken proxy)."""

    content: str = ""
    finish_reason: str = "stop"
    status: int = 200
    delay_s: float = 0.0
    raw: bytes | None = None


class FakeOpenAIServer:
    def __init__(self, model: str = "fake-coder", api_key: str | None = None) -> None:
        self.model, self.api_key = model, api_key
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._answers: list[Answer] = []
        self._responder: Any = None  # body -> Answer, once the script is used up (see play)
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self) -> FakeOpenAIServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    server._send(self, 200, {"object": "list", "data": [
                        {"id": server.model, "object": "model", "owned_by": "vllm"}]})
                else:
                    server._error(self, 404, f"no route {self.path}")

            def do_POST(self) -> None:
                server._chat(self)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5)
            self._httpd = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *answers: Answer) -> None:
        with self._lock:
            self._answers.extend(answers)

    def play(self, responder: Any) -> None:
        """Answer every request the script does not with ``responder(body) -> Answer``: a
        model that reads the prompt (which schema was asked for, what the trials measured)."""
        self._responder = responder

    @property
    def pending(self) -> int:
        return len(self._answers)

    # ---- protocol -----------------------------------------------------------------------
    def _chat(self, h: BaseHTTPRequestHandler) -> None:
        if h.path.rstrip("/") != "/v1/chat/completions":
            return self._error(h, 404, f"no route {h.path}")
        if self.api_key and h.headers.get("Authorization") != f"Bearer {self.api_key}":
            return self._error(h, 401, "Unauthorized")
        try:
            body = json.loads(h.rfile.read(int(h.headers.get("Content-Length", 0))))
        except json.JSONDecodeError:
            return self._error(h, 400, "request body is not JSON")
        with self._lock:
            self.requests.append(body)
            self.headers.append(dict(h.headers))
            answer = self._answers.pop(0) if self._answers else None
        problem = self._check(body)
        if problem:
            return self._error(h, 404 if "does not exist" in problem else 400, problem)
        if answer is None and self._responder is not None:
            answer = self._responder(body)
        if answer is None:
            return self._error(h, 500, "no scripted answer left")
        if answer.delay_s:
            time.sleep(answer.delay_s)
        if answer.raw is not None:
            return self._send_bytes(h, answer.status, answer.raw)
        if answer.status != 200:
            return self._error(h, answer.status, "scripted error")
        prompt_tokens = sum(len(m.get("content", "")) for m in body["messages"]) // 4
        completion_tokens = max(1, len(answer.content) // 4)
        self._send(h, 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "created": int(time.time()), "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.content},
                         "finish_reason": answer.finish_reason, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    def _check(self, body: dict[str, Any]) -> str | None:
        if body.get("model") != self.model:
            return f"The model `{body.get('model')}` does not exist."
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all("role" in m and "content" in m for m in msgs):
            return "messages must be a non-empty list of {role, content}"
        if body.get("stream"):
            return "this test server does not stream; the client must send stream=false"
        rf = body.get("response_format")
        if rf is not None:
            if rf.get("type") == "json_schema":
                if not isinstance((rf.get("json_schema") or {}).get("schema"), dict):
                    return "response_format.json_schema.schema must be an object"
            elif rf.get("type") not in ("json_object", "text"):
                return f"unknown response_format type {rf.get('type')!r}"
        so = body.get("structured_outputs")
        if so is not None and not isinstance(so.get("json"), dict):
            return "structured_outputs.json must be a JSON schema object"
        if "guided_json" in body and not isinstance(body["guided_json"], dict):
            return "guided_json must be a JSON schema object"
        return None

    def _error(self, h: BaseHTTPRequestHandler, status: int, message: str) -> None:
        self._send(h, status, {"object": "error", "message": message,
                               "type": "BadRequestError" if status < 500 else "InternalServerError",
                               "param": None, "code": status})

    def _send(self, h: BaseHTTPRequestHandler, status: int, obj: dict[str, Any]) -> None:
        self._send_bytes(h, status, json.dumps(obj).encode())

    @staticmethod
    def _send_bytes(h: BaseHTTPRequestHandler, status: int, data: bytes) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)
