"""A small client of an OpenAI-compatible chat-completions endpoint (vLLM's ``vllm serve``).

Plain ``urllib`` (no SDK): every timeout, retry and error class is ours to decide. Structured
output is requested with a JSON schema, in the form the server understands:

* ``"response_format"`` (default): OpenAI's ``{"type": "json_schema", "json_schema": {name,
  schema, strict}}`` — vLLM enforces it with its structured-output backend (xgrammar/guidance);
* ``"structured_outputs"``: vLLM >= 0.12's extra body field ``{"structured_outputs": {"json":
  schema}}``;
* ``"guided_json"``: the field of vLLM < 0.12 (removed in 0.12).

Streaming is always off. Transient failures (connection refused or reset, timeouts, HTTP 429
and 5xx) are retried with exponential backoff; a 4xx is not. A token budget caps the run's
spend: usage is read from each answer, and a request that could exceed the rest is refused
before it is sent.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any

from infrarsi.errors import InfraRSIError

STRUCTURED_MODES = ("response_format", "structured_outputs", "guided_json")


class LLMError(InfraRSIError):
    """The LLM endpoint did not give a usable answer; ``kind`` says why (a counter name)."""

    kind = "error"

    def __init__(self, message: str, answer: str = "") -> None:
        super().__init__(message)
        self.answer = answer


class LLMUnavailable(LLMError):
    kind = "unavailable"


class LLMTimeout(LLMError):
    kind = "timeout"


class LLMHTTPError(LLMError):
    kind = "http_error"
    status = 0


class LLMBadResponse(LLMError):
    kind = "bad_response"


class LLMTruncated(LLMError):
    kind = "truncated"


class LLMBudgetExceeded(LLMError):
    kind = "budget_exhausted"


@dataclass
class ChatResult:
    content: str
    finish_reason: str
    usage: dict[str, int]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChatClient:
    """``complete(messages, schema)`` against ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``)."""

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 60.0
    max_retries: int = 2
    backoff_s: float = 0.5
    token_budget: int | None = 200_000
    structured_mode: str = "response_format"
    temperature: float = 0.2
    tokens_used: int = 0
    retries: int = 0

    def __post_init__(self) -> None:
        if self.structured_mode not in STRUCTURED_MODES:
            raise ValueError(f"structured_mode {self.structured_mode!r} must be one of {STRUCTURED_MODES}")

    @classmethod
    def from_spec(cls, llm_spec: Any, **kw: Any) -> ChatClient:
        """From a task spec's ``llm:`` section; the key comes from ``$<api_key_env>``."""
        base = os.environ.get("INFRARSI_LLM_BASE_URL") or llm_spec.base_url
        model = os.environ.get("INFRARSI_LLM_MODEL") or llm_spec.model
        if not model:
            raise ValueError("llm.model is empty: set it in the task spec or $INFRARSI_LLM_MODEL "
                             "(the name `vllm serve` was started with)")
        return cls(base, model, os.environ.get(llm_spec.api_key_env), timeout_s=llm_spec.timeout_s, **kw)

    # ---- request ----------------------------------------------------------------------
    def body(self, messages: list[dict[str, str]], schema: dict[str, Any], name: str,
             max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": False,
                                "max_tokens": max_tokens, "temperature": self.temperature}
        if self.structured_mode == "response_format":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": name, "schema": schema, "strict": True}}
        elif self.structured_mode == "structured_outputs":
            body["structured_outputs"] = {"json": schema}
        else:
            body["guided_json"] = schema
        return body

    def complete(self, messages: list[dict[str, str]], schema: dict[str, Any], *,
                 name: str = "answer", max_tokens: int = 2048) -> ChatResult:
        """The assistant message's content (a JSON text when the server honours the schema).

        Raises an :class:`LLMError` subclass; a truncated answer (``finish_reason == "length"``)
        raises :class:`LLMTruncated` carrying the partial text.
        """
        estimate = sum(len(m.get("content", "")) for m in messages) // 3 + max_tokens
        if self.token_budget is not None and self.tokens_used + estimate > self.token_budget:
            raise LLMBudgetExceeded(
                f"token budget {self.token_budget} would be exceeded ({self.tokens_used} used, "
                f"~{estimate} needed); raise it or shorten the prompt")
        payload = json.dumps(self.body(messages, schema, name, max_tokens)).encode()
        request_id = uuid.uuid4().hex[:12]
        last: LLMError | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.retries += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            t0 = time.monotonic()
            try:
                data = self._post(payload, request_id)
            except (LLMUnavailable, LLMTimeout) as e:
                last = e
                continue
            except LLMHTTPError as e:
                if e.status == 429 or e.status >= 500:
                    last = e
                    continue
                raise
            return self._result(data, request_id, attempt, time.monotonic() - t0)
        assert last is not None
        raise last

    def _post(self, payload: bytes, request_id: str) -> dict[str, Any]:
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.base_url.rstrip("/") + "/chat/completions",
                                     data=payload, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode(errors="replace")
            err = LLMHTTPError(f"HTTP {e.code} from {self.base_url}: {detail}")
            err.status = e.code
            raise err from None
        except TimeoutError as e:
            raise LLMTimeout(f"no answer from {self.base_url} within {self.timeout_s:g} s") from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, (TimeoutError, socket.timeout)):
                raise LLMTimeout(f"no answer from {self.base_url} within {self.timeout_s:g} s") from e
            raise LLMUnavailable(f"cannot reach {self.base_url}: {e.reason}; is `vllm serve` "
                                 "running (cluster/vllm/serve.sh)?") from e
        except (ConnectionError, OSError) as e:
            raise LLMUnavailable(f"connection to {self.base_url} failed: {e}") from e
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise LLMBadResponse(f"the server's reply is not JSON: {raw[:200]!r}") from None

    def _result(self, data: dict[str, Any], request_id: str, attempt: int, seconds: float) -> ChatResult:
        try:
            choice = data["choices"][0]
            content = choice["message"]["content"] or ""
            finish = choice.get("finish_reason") or ""
        except (KeyError, IndexError, TypeError):
            raise LLMBadResponse(f"reply without choices[0].message.content: {str(data)[:200]}") from None
        usage = {k: int(v) for k, v in (data.get("usage") or {}).items() if isinstance(v, int)}
        self.tokens_used += usage.get("total_tokens", len(content) // 3)
        meta = {"model": self.model, "request_id": request_id, "attempts": attempt + 1,
                "seconds": round(seconds, 3), "finish_reason": finish, "usage": usage,
                "structured_mode": self.structured_mode}
        if finish == "length":
            raise LLMTruncated(f"the answer was cut at max_tokens ({usage.get('completion_tokens')} "
                               "tokens); raise max_tokens or ask for less", answer=content)
        return ChatResult(content, finish, usage, meta)
