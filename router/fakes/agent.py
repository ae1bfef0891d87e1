"""An agent driver: replays the *shape* of a logged run against an OpenAI-compatible endpoint.

A logged run is a sequence of steps with token counts, whether the step offered tools and whether
the tool result it consumed was an error (:class:`RunShape`). :func:`drive_run` turns it back into
real chat-completions traffic, as an agent would send it:

1. The first prompt is a system message of ~80% and a user message of ~20% of the first step's
   prompt tokens (capped at ``max_prompt_tokens``), made of :func:`words` (one token per word for
   the fake backends' tokeniser, and 4 bytes per word so a bytes/4 estimate agrees).
2. Each step POSTs ``/v1/chat/completions`` with ``model`` (``"auto"``: the sidecar routes), the
   whole history, the tool schema when the logged step offered tools, ``max_tokens`` = the logged completion (capped at
   ``max_completion_tokens``) and an ``X-Run-Id`` header (run id + ``tag``). It records the
   status, the latency, the routing headers (``x-runroute-tier`` / ``-replica`` / ``-reason``) and
   the usage (prompt, completion and cached tokens) as a :class:`StepResult`.
3. The history grows as the logged run grew: the assistant message is appended, then either one
   tool result per tool call (the last one prefixed ``error:`` when the next logged step consumed a
   failed tool result) or a user message, sized so that the next prompt is about the next logged
   prompt (at least 8 tokens, never beyond ``max_prompt_tokens``). Tool pauses are 0.
4. It stops at ``max_steps``, at the first non-200 answer, or when ``clock()`` passes ``deadline``.

The HTTP client is the standard library's (``http.client``, one keep-alive connection per run), so
the driver needs nothing beyond the router's own dependencies. The body is compact UTF-8 JSON.

Knobs (:class:`DriveLimits`): ``max_steps``, ``max_prompt_tokens``, ``max_completion_tokens``,
``timeout_s`` (per request); and per call ``model``, ``deadline`` (against the injected ``clock``, default
``time.monotonic``) and ``tag`` (appended to the run id so several passes over the same run do not
share router state).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from router.core.figures import is_short

__all__ = ["TOOLS", "StepShape", "RunShape", "DriveLimits", "StepResult", "words", "drive_run"]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "look something up",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


@dataclass(frozen=True)
class StepShape:
    """One logged step: prompt and completion tokens, tools offered, failed tool result consumed."""

    prompt: int
    completion: int
    tool: bool = False
    error: bool = False


@dataclass(frozen=True)
class RunShape:
    run_id: str
    steps: tuple[StepShape, ...]


@dataclass(frozen=True)
class DriveLimits:
    max_steps: int = 10
    max_prompt_tokens: int = 8000
    max_completion_tokens: int = 96
    timeout_s: float = 30.0


@dataclass(frozen=True)
class StepResult:
    """What one step got back (``tier`` is None when the answer was not 200)."""

    step: int
    status: int
    latency_s: float
    tier: str | None = None
    replica: str | None = None
    reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    short: bool = False


def words(n: int, tag: str) -> str:
    """About ``n`` tokens for the fake's tokeniser (a space + a word of <= 4 characters is one token)."""
    n = max(1, int(n))
    # 3-character words: 4 bytes with the space, so the router's bytes/4 estimate matches the fake's count
    salt = sum(map(ord, tag)) % 97
    return " ".join(f"{chr(97 + (i + salt) % 26)}{(i * 7 + salt) % 100:02d}" for i in range(n))


class _Client:
    """One keep-alive HTTP/1.1 connection to ``url``. A request on a *reused* connection that the
    server had closed meanwhile is sent again once on a new connection (nothing was processed);
    a failure on a fresh connection is raised."""

    def __init__(self, url: str, timeout_s: float) -> None:
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"agent driver: expected an http://host:port URL, got {url!r}")
        self._host, self._port, self._timeout = u.hostname, u.port or 80, timeout_s
        self._base = u.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    def post_json(self, path: str, body: dict[str, object], headers: dict[str, str]) -> tuple[int, Any, Any]:
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        hdrs = {"Content-Type": "application/json", "Content-Length": str(len(data)), **headers}
        while True:
            fresh = self._conn is None
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            try:
                self._conn.request("POST", self._base + path, body=data, headers=hdrs)
                resp = self._conn.getresponse()
                raw = resp.read()
            except (ConnectionError, http.client.BadStatusLine):
                self.close()
                if fresh:
                    raise
                continue
            return resp.status, resp.headers, (json.loads(raw) if raw else None)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def drive_run(
    url: str,
    run: RunShape,
    *,
    limits: DriveLimits = DriveLimits(),
    deadline: float = float("inf"),
    tag: str = "",
    model: str = "auto",
    clock: Callable[[], float] = time.monotonic,
) -> list[StepResult]:
    """Replay ``run`` against ``url`` (the module docstring); returns one result per step sent."""
    steps: Sequence[StepShape] = run.steps[: limits.max_steps]
    out: list[StepResult] = []
    if not steps:
        return out
    p0 = min(int(steps[0].prompt), limits.max_prompt_tokens)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": words(int(p0 * 0.8), "sys")},
        {"role": "user", "content": words(max(8, int(p0 * 0.2)), tag)},
    ]
    client = _Client(url, limits.timeout_s)
    try:
        for k, s in enumerate(steps):
            if clock() > deadline:
                break
            body: dict[str, Any] = {
                "model": model,
                "messages": msgs,
                "max_tokens": max(1, min(int(s.completion), limits.max_completion_tokens)),
            }
            if s.tool:
                body["tools"] = TOOLS
            t0 = time.perf_counter()
            status, headers, j = client.post_json(
                "/v1/chat/completions", body, {"X-Run-Id": run.run_id + tag}
            )
            lat = time.perf_counter() - t0
            if status != 200:
                out.append(StepResult(step=k, status=status, latency_s=lat))
                break
            u = j.get("usage") or {}
            det = u.get("prompt_tokens_details") or {}
            m = j["choices"][0]["message"]
            out.append(
                StepResult(
                    step=k,
                    status=200,
                    latency_s=lat,
                    tier=headers.get("x-runroute-tier"),
                    replica=headers.get("x-runroute-replica"),
                    reason=headers.get("x-runroute-reason"),
                    prompt_tokens=int(u.get("prompt_tokens") or 0),
                    completion_tokens=int(u.get("completion_tokens") or 0),
                    cached_tokens=int(det.get("cached_tokens") or 0),
                    short=is_short(int(u.get("completion_tokens") or 0), bool(m.get("tool_calls"))),
                )
            )
            msgs.append({k2: v for k2, v in m.items() if v is not None})
            _grow(msgs, m, s, steps[k + 1] if k + 1 < len(steps) else None, k, u, limits)
    finally:
        client.close()
    return out


def _grow(
    msgs: list[dict[str, Any]],
    m: dict[str, Any],
    s: StepShape,
    nxt: StepShape | None,
    k: int,
    usage: dict[str, Any],
    limits: DriveLimits,
) -> None:
    """Append what the agent sends next: tool results for the tool calls, else a user message."""
    grow = 16
    if nxt is not None:
        grow = max(8, int(nxt.prompt) - int(s.prompt) - int(s.completion))
        room = limits.max_prompt_tokens - int(usage.get("prompt_tokens") or 0) - int(s.completion)
        grow = max(8, min(grow, room))
    if m.get("tool_calls"):
        calls = m["tool_calls"]
        err = bool(nxt and nxt.error)
        for i, tc in enumerate(calls):
            prefix = "error: tool failed. " if (err and i == len(calls) - 1) else ""
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": tc.get("id", f"c{i}"),
                    "content": prefix + words(max(4, grow // len(calls)), f"t{k}"),
                }
            )
    else:
        msgs.append({"role": "user", "content": words(grow, f"u{k}")})
