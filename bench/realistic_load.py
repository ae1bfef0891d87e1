"""Open-loop load of many concurrent agent runs whose bodies grow step by step (aiohttp client).

Algorithm:

1. A population of ``--runs`` runs, each ``--steps`` steps long. Step ``k`` (0-based) of a run is a chat
   completions body: the run's opening (a ~1 KB system prompt and a user task, both naming the run, so
   openings differ between runs) followed by ``k + 1`` (assistant tool call, tool result) message pairs,
   so every step carries a tool result after the last assistant message (every 7th result is a
   traceback). Body sizes grow linearly from ``--min-body`` (step 0) to ``--max-body`` (last step); the
   request also offers three tools and sets ``max_tokens``. The run id goes in the ``X-Run-Id`` header
   or ``metadata.run_id`` (``--id-via``).
2. Bodies are built from pre-serialised bytes: the pairs of all steps are serialised once, joined per
   step once (``history[k]``), and a request's body is ``head(run) + history[k] + tail`` (one copy of at
   most ``--max-body`` bytes, made *before* the request's scheduled time), so the client's own cost does
   not grow with the body.
3. Run state (``--state``, JSON): each run's next step and generation, and the round-robin cursor. A new
   state spreads the runs' next steps evenly over ``0..steps-1`` (run ``r`` starts at ``r * steps //
   runs``) and fixes a seeded permutation of the runs. A run past its last step starts again as a new
   run (generation + 1, a new run id) at step 0, so the population stays at ``--runs`` runs at all
   points of their lives.
4. ``--prime``: closed loop (``--concurrency`` workers, non-streaming): for each run, send its steps
   ``0 .. next-1`` in order, so a stateful sidecar holds every run's real history before the measured
   cells. The state is not changed. Prints ``progress DONE TOTAL`` lines.
5. Otherwise one measured cell: arrivals are Poisson at ``--rate`` for ``--duration`` s (seed
   ``--seed``), each arrival is the next run in the permutation (round robin: a run sends again only
   after all the others did) at its next step. Open loop: latency is measured from the *scheduled*
   send time, so client lag is charged to the latency; sending stops at ``--duration`` and requests
   still open ``--drain`` s later are cancelled (errors). The same state and seed give every system the
   same sequence of (time, run, step), so systems compare request for request.
6. One record per request to ``--out`` (JSONL): system, run, generation, step, body bytes, scheduled /
   sent / first byte / done times (s from the cell start; ``client_cpu_s`` in the result is this
   process's CPU from the first send to the end of the drain), status (``-1`` exception, ``-2`` cancelled
   at drain, ``-3`` incomplete stream), the sidecar's ``x-runroute-step`` and ``x-runroute-tier``
   when present. Last stdout line: ``result {json}`` (counts).

Knobs: ``--url``, ``--model``, ``--label``, ``--runs`` (1000), ``--steps`` (50), ``--min-body`` (2048),
``--max-body`` (204800), ``--id-via`` (header | metadata), ``--stream``, ``--rate``, ``--duration``,
``--drain``, ``--seed``, ``--timeout`` (s per request), ``--prime``, ``--concurrency`` (prime workers).
Protocol (``--protocol``; ``BODIES`` maps a protocol to its body builder and path): ``chat``,
``responses`` (the same conversation as Responses input items: the system prompt as
``instructions``, each (tool call, tool result) pair as a ``function_call`` and a
``function_call_output`` item, the tools as Responses function tools) or ``messages`` (Anthropic
Messages: ``system``, each pair as an assistant ``tool_use`` turn and a user ``tool_result`` turn).
The bodies of one step have about the same size in every protocol.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

__all__ = [
    "BODIES",
    "ChatBodies",
    "ResponsesBodies",
    "MessagesBodies",
    "RunState",
    "main",
    "run_cell",
    "prime",
]

_WORDS = (
    "def return self value index config request response token cache step run tool result error path "
    "file line import class async await record feature policy backend replica frontier local assert"
).split()
_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} in the repository",
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]},
        },
    }
    for name, arg in (("read_file", "path"), ("run_shell", "command"), ("search_code", "query"))
]


def _text(rng: random.Random, n: int, error: bool) -> str:
    """About ``n`` characters of tool output: numbered source/log lines; a traceback when ``error``."""
    out = ['Traceback (most recent call last):\n  File "src/app.py", line 12, in <module>\n'] if error else []
    size = len(out[0]) if out else 0
    i = 0
    while size < n:
        i += 1
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12)))
        line = f"src/mod{rng.randint(0, 40)}.py:{i}: {words}\n"
        out.append(line)
        size += len(line)
    return "".join(out)[:n]


class ChatBodies:
    """Chat-completions bodies of step ``k`` of a run, as bytes, from pre-serialised parts."""

    path = "/v1/chat/completions"
    ok_marker, done_marker = b'"choices"', b"[DONE]"

    def __init__(self, model: str, steps: int, min_body: int, max_body: int, stream: bool, id_via: str):
        if steps < 2 or min_body < 1024 or max_body < min_body:
            raise SystemExit("realistic_load: need steps >= 2 and 1024 <= min_body <= max_body")
        self.model, self.stream, self.id_via, self.steps = model, stream, id_via, steps
        tools = orjson.dumps(_TOOLS)
        self._tail = b'],"tools":' + tools + b',"max_tokens":64,"temperature":0,"stream":false'
        rng = random.Random(7)
        # the history is sized with the non-streaming tail in both modes, so a run's streamed bodies
        # carry the same conversation (the same bytes up to the tail) as its plain ones: a client
        # that switches to streaming does not edit its history (before, "true" being one byte
        # shorter made every tool result of a streamed body different, so a run's first streamed
        # step after priming missed the sidecar's parse cache)
        fixed = len(self.head(0, 0)) + len(self.tail("rr-0000-g0"))
        if stream:
            self._tail = self._tail[: -len(b"false")] + b"true"
        pairs: list[bytes] = []
        size = fixed
        for k in range(steps):
            target = min_body + (max_body - min_body) * k / (steps - 1)
            tool = _TOOLS[k % 3]["function"]
            call_id = f"call_{k:03d}"
            asst = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": tool["name"],
                            "arguments": orjson.dumps({"q": f"step {k}"}).decode(),
                        },
                    }
                ],
            }
            shell = (
                b","
                + orjson.dumps(asst)
                + b","
                + orjson.dumps({"role": "tool", "tool_call_id": call_id, "content": ""})
            )
            need = int(target - size)
            content = _text(rng, max(16, need - len(shell)), error=k % 7 == 6)
            pair = self._pair(asst, call_id, content)
            if len(pair) > need > len(shell) + 16:  # JSON escapes (newlines) made it longer: trim once
                pair = self._pair(asst, call_id, content[: len(content) - (len(pair) - need)])
            pairs.append(pair)
            size += len(pair)
        self.history = [b"".join(pairs[: k + 1]) for k in range(steps)]

    @staticmethod
    def _pair(asst: dict[str, Any], call_id: str, content: str) -> bytes:
        res = {"role": "tool", "tool_call_id": call_id, "content": content}
        return b"," + orjson.dumps(asst) + b"," + orjson.dumps(res)

    def head(self, run: int, gen: int) -> bytes:
        system = (
            f"You are coding agent #{run} (attempt {gen}). Work in small steps: read files, run tests, "
            "search the code, then answer with a patch. " + " ".join(_WORDS) * 4
        )
        user = f"Task {run}-{gen}: fix the failing test in module {run % 97} and explain the change."
        msgs = orjson.dumps([{"role": "system", "content": system}, {"role": "user", "content": user}])
        return b'{"model":' + orjson.dumps(self.model) + b',"messages":' + msgs[:-1]

    def tail(self, run_id: str) -> bytes:
        meta = b',"metadata":{"run_id":' + orjson.dumps(run_id) + b"}" if self.id_via == "metadata" else b""
        return self._tail + meta + b"}"

    def body(self, run: int, gen: int, step: int, run_id: str) -> bytes:
        return self.head(run, gen) + self.history[step] + self.tail(run_id)


class ResponsesBodies(ChatBodies):
    """The same conversations as OpenAI Responses requests (module docstring)."""

    path = "/v1/responses"
    ok_marker, done_marker = b'"output"', b"response.completed"

    def __init__(self, *args: Any):
        self._rtools = [
            {"type": "function", **{k: t["function"][k] for k in ("name", "description", "parameters")}}
            for t in _TOOLS
        ]
        super().__init__(*args)
        self._tail = self._tail.replace(
            b'],"tools":' + orjson.dumps(_TOOLS), b'],"tools":' + orjson.dumps(self._rtools)
        )
        self._tail = self._tail.replace(b'"max_tokens":64', b'"max_output_tokens":64')

    @staticmethod
    def _pair(asst: dict[str, Any], call_id: str, content: str) -> bytes:
        fn = asst["tool_calls"][0]["function"]
        call = {"type": "function_call", "call_id": call_id, "name": fn["name"], "arguments": fn["arguments"]}
        out = {"type": "function_call_output", "call_id": call_id, "output": content}
        return b"," + orjson.dumps(call) + b"," + orjson.dumps(out)

    def head(self, run: int, gen: int) -> bytes:
        chat = orjson.loads(super().head(run, gen) + b"]}")
        system, user = chat["messages"][0]["content"], chat["messages"][1]
        return (
            b'{"model":'
            + orjson.dumps(self.model)
            + b',"instructions":'
            + orjson.dumps(system)
            + b',"input":['
            + orjson.dumps(user)
        )


class MessagesBodies(ChatBodies):
    """The same conversations as Anthropic Messages requests (module docstring)."""

    path = "/v1/messages"
    ok_marker, done_marker = b'"content"', b"message_stop"

    def __init__(self, *args: Any):
        self._atools = [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in _TOOLS
        ]
        super().__init__(*args)
        self._tail = self._tail.replace(
            b'],"tools":' + orjson.dumps(_TOOLS), b'],"tools":' + orjson.dumps(self._atools)
        )

    @staticmethod
    def _pair(asst: dict[str, Any], call_id: str, content: str) -> bytes:
        fn = asst["tool_calls"][0]["function"]
        use = {"type": "tool_use", "id": call_id, "name": fn["name"], "input": orjson.loads(fn["arguments"])}
        res = {"type": "tool_result", "tool_use_id": call_id, "content": content}
        return (
            b","
            + orjson.dumps({"role": "assistant", "content": [use]})
            + b","
            + orjson.dumps({"role": "user", "content": [res]})
        )

    def head(self, run: int, gen: int) -> bytes:
        chat = orjson.loads(super().head(run, gen) + b"]}")
        system, user = chat["messages"][0]["content"], chat["messages"][1]
        return (
            b'{"model":'
            + orjson.dumps(self.model)
            + b',"system":'
            + orjson.dumps(system)
            + b',"messages":['
            + orjson.dumps(user)
        )

    def tail(self, run_id: str) -> bytes:
        meta = b',"metadata":{"user_id":' + orjson.dumps(run_id) + b"}" if self.id_via == "metadata" else b""
        return self._tail + meta + b"}"


BODIES = {"chat": ChatBodies, "responses": ResponsesBodies, "messages": MessagesBodies}


class RunState:
    """Next step and generation of every run, and the round-robin cursor (JSON on disk)."""

    def __init__(self, runs: int, steps: int, seed: int = 0):
        self.steps = steps
        self.next = [r * steps // runs for r in range(runs)]
        self.gen = [0] * runs
        self.order = list(range(runs))
        random.Random(seed).shuffle(self.order)
        self.cursor = 0

    @staticmethod
    def run_id(run: int, gen: int) -> str:
        return f"rr-{run:04d}-g{gen}"

    def take(self) -> tuple[int, int, int]:
        """(run, generation, step) of the next arrival; advances that run."""
        r = self.order[self.cursor % len(self.order)]
        self.cursor += 1
        gen, step = self.gen[r], self.next[r]
        if step + 1 >= self.steps:
            self.gen[r], self.next[r] = gen + 1, 0
        else:
            self.next[r] = step + 1
        return r, gen, step

    @classmethod
    def load(cls, path: Path, runs: int, steps: int) -> RunState:
        st = cls(runs, steps)
        if path.exists():
            d = json.loads(path.read_text())
            if len(d["next"]) != runs or d["steps"] != steps:
                raise SystemExit(f"realistic_load: {path} was made for other --runs/--steps")
            st.next, st.gen, st.order, st.cursor = d["next"], d["gen"], d["order"], d["cursor"]
        return st

    def save(self, path: Path) -> None:
        d = {
            "steps": self.steps,
            "next": self.next,
            "gen": self.gen,
            "order": self.order,
            "cursor": self.cursor,
        }
        path.write_text(json.dumps(d))


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    stream: bool,
    t_sched: float,
    markers: tuple[bytes, bytes] = (ChatBodies.ok_marker, ChatBodies.done_marker),
) -> dict[str, Any]:
    rec: dict[str, Any] = {"t_sched": t_sched, "t_sent": time.perf_counter(), "t_first": None, "status": -1}
    try:
        async with session.post(url, data=body, headers=headers) as r:
            rec["srv_step"] = r.headers.get("x-runroute-step")
            rec["tier"] = r.headers.get("x-runroute-tier")
            if stream:
                last, done = b"", False
                async for chunk in r.content.iter_any():
                    if rec["t_first"] is None:
                        rec["t_first"] = time.perf_counter()
                    done = done or markers[1] in last + chunk
                    last = (last + chunk)[-64:]
                ok = r.status != 200 or done
            else:
                data = await r.read()
                rec["t_first"] = time.perf_counter()
                ok = r.status != 200 or markers[0] in data
            rec["status"] = r.status if ok else -3
    except asyncio.CancelledError:
        rec["status"] = -2
        raise
    except Exception as e:  # noqa: BLE001 - every failure is one error record
        rec["error"] = type(e).__name__
    finally:
        rec["t_done"] = time.perf_counter()
    return rec


def _session(timeout_s: float) -> aiohttp.ClientSession:
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s))


def _headers(a: argparse.Namespace, run_id: str) -> dict[str, str]:
    h = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    if a.id_via == "header":
        h["X-Run-Id"] = run_id
    return h


async def run_cell(a: argparse.Namespace, st: RunState) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    bodies = BODIES[a.protocol](a.model, a.steps, a.min_body, a.max_body, a.stream, a.id_via)
    url = a.url.rstrip("/") + bodies.path
    rng = random.Random(a.seed)
    records: list[dict[str, Any]] = []
    pending: dict[asyncio.Task, dict[str, Any]] = {}

    async def one(meta: dict[str, Any], body: bytes, headers: dict[str, str], t_sched: float) -> None:
        try:
            rec = await _send(
                session, url, body, headers, a.stream, t_sched, (bodies.ok_marker, bodies.done_marker)
            )
        except asyncio.CancelledError:
            meta.update(t_sched=t_sched, t_sent=None, t_first=None, t_done=None, status=-2)
            records.append(meta)
            raise
        meta.update(rec)
        records.append(meta)

    async with _session(a.timeout) as session:
        warm = [session.get(a.url.rstrip("/") + "/v1/models") for _ in range(16)]
        for resp in await asyncio.gather(*warm, return_exceptions=True):
            if isinstance(resp, aiohttp.ClientResponse):
                resp.release()
        t0 = t_next = time.perf_counter()
        cpu0 = time.process_time()
        max_n = int(a.rate * a.duration * 1.5) + 10
        while len(pending) + len(records) < max_n:
            t_next += rng.expovariate(a.rate)
            if t_next - t0 >= a.duration:
                break
            run, gen, step = st.take()
            rid = st.run_id(run, gen)
            body = bodies.body(run, gen, step, rid)  # built before the scheduled time: not charged
            meta = {"sys": a.label, "run": run, "gen": gen, "step": step, "bytes": len(body)}
            delay = t_next - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.ensure_future(one(meta, body, _headers(a, rid), t_next))
            pending[task] = meta
            task.add_done_callback(lambda t: pending.pop(t, None))
        t_end_send = time.perf_counter()
        if pending:
            _done, left = await asyncio.wait(list(pending), timeout=a.drain)
            for t in left:
                t.cancel()
            await asyncio.gather(*left, return_exceptions=True)
        cpu_s = time.process_time() - cpu0
    for rec in records:
        for k in ("t_sched", "t_sent", "t_first", "t_done"):
            if rec.get(k) is not None:
                rec[k] = round(rec[k] - t0, 6)
    ok = sum(1 for r in records if r["status"] == 200)
    return records, {
        "sent": len(records),
        "ok": ok,
        "send_s": round(t_end_send - t0, 3),
        "client_cpu_s": round(cpu_s, 3),
    }


async def prime(a: argparse.Namespace, st: RunState) -> dict[str, Any]:
    bodies = BODIES[a.protocol](a.model, a.steps, a.min_body, a.max_body, False, a.id_via)
    url = a.url.rstrip("/") + bodies.path
    todo = [(r, st.gen[r], st.next[r]) for r in st.order if st.next[r] > 0]
    total = sum(n for _r, _g, n in todo)
    counts = {"sent": 0, "ok": 0, "step_mismatch": 0}
    queue: asyncio.Queue[tuple[int, int, int]] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            run, gen, n = queue.get_nowait()
            rid = st.run_id(run, gen)
            for step in range(n):
                body = bodies.body(run, gen, step, rid)
                rec = await _send(
                    session, url, body, _headers(a, rid), False, 0.0, (bodies.ok_marker, bodies.done_marker)
                )
                counts["sent"] += 1
                counts["ok"] += rec["status"] == 200
                if rec.get("srv_step") is not None and rec["srv_step"] != str(step):
                    counts["step_mismatch"] += 1
                if counts["sent"] % 500 == 0:
                    print(f"progress {counts['sent']} {total}", flush=True)

    t0 = time.perf_counter()
    async with _session(a.timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(a.concurrency)))
    return {**counts, "total": total, "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="fake-model")
    ap.add_argument("--label", default="")
    ap.add_argument("--protocol", choices=sorted(BODIES), default="chat")
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--min-body", type=int, default=2048)
    ap.add_argument("--max-body", type=int, default=204800)
    ap.add_argument("--id-via", choices=["header", "metadata"], default="header")
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--drain", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--prime", action="store_true")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # plain asyncio still works, a little slower
        pass
    st = RunState.load(a.state, a.runs, a.steps)
    if a.prime:
        result = asyncio.run(prime(a, st))
    else:
        records, result = asyncio.run(run_cell(a, st))
        st.save(a.state)
        if a.out is not None:
            with open(a.out, "wb") as fh:
                fh.writelines(orjson.dumps(r) + b"\n" for r in records)
    print("result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
