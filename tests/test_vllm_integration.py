"""Real vLLM (CPU) behind the router: prefix-cache hits across a run's steps, counters that agree,
replica stickiness and the cost of moving a run. Those tests are marked ``vllm`` (``make test-vllm``);
the launcher's argv/env and the metrics parser are checked here without vLLM (plain ``make test``).

Two vLLM servers (replica 0 and 1, one core each) are started once for the module from
``.venv-vllm`` with the tiny locally built model (``runroute make-test-model``). Without them the
tests skip with the reason (``RUNROUTE_VLLM_REQUIRED=1``, set by scripts/test-vllm.sh, makes that a
failure instead).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.localnode.launch import (
    LocalNode,
    LocalNodeConfig,
    LocalNodeError,
    build_argv,
    build_env,
    find_vllm_python,
    project_root,
)
from router.server.metrics.parse import MetricsParseError, parse_prometheus_text, read_vllm_metrics

MODEL = "local"
BLOCK = 32


def _unavailable(reason: str) -> None:
    if os.environ.get("RUNROUTE_VLLM_REQUIRED") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _model_dir() -> Path:
    return Path(os.environ.get("RUNROUTE_VLLM_TEST_MODEL") or project_root() / ".runroute" / "test-model")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two vLLM replicas started side by side; stopped (process groups killed) at module end."""
    try:
        python = find_vllm_python()
    except LocalNodeError as e:
        _unavailable(f"vllm not importable: {e}")
    model = _model_dir()
    if not (model / "config.json").is_file():
        _unavailable(
            f"test model absent at {model}: run `make test-vllm` (or runroute make-test-model {model})"
        )
    state = tmp_path_factory.mktemp("vllm-state")
    nodes = [
        LocalNode(
            LocalNodeConfig(
                model=str(model),
                port=_free_port(),
                served_model_name=MODEL,
                replica_index=i,
                python=python,
                state_dir=str(state),
                block_size=BLOCK,
                health_timeout_s=240,
            )
        )
        for i in range(2)
    ]
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            n.wait_healthy()
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def filler(run_id: str, n_words: int) -> str:
    words = ("route", "replica", "prefix", "cache", "token", "policy", "frontier", "local", "step", "tool")
    body = " ".join(f"{words[i % len(words)]}{i % 97}" for i in range(n_words))
    return f"Run {run_id}. You are an agent working on task {run_id}. {body}"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


class AgentRun:
    """A tool-using agent conversation that only appends, as agents do: each step's prompt extends the last."""

    def __init__(self, run_id: str, system_words: int = 600):
        self.run_id = run_id
        self.messages: list[dict[str, Any]] = [
            {"role": "system", "content": filler(run_id, system_words)},
            {"role": "user", "content": f"Fix the failing test in task {run_id}."},
        ]

    def body(self, model: str = MODEL, **extra: Any) -> dict[str, Any]:
        return {
            "model": model,
            "messages": self.messages,
            "tools": TOOLS,
            "max_tokens": 8,
            "temperature": 0,
            **extra,
        }

    def advance(self, response: dict[str, Any], k: int) -> None:
        """Append the assistant turn (a tool call) and its tool result.

        The assistant text is fixed rather than the random model's output: junk text that starts with
        whitespace could merge with the template's newline into another token, which would shift
        block boundaries and make the exact block arithmetic below flaky. The tool call itself is
        what agents send back.
        """
        assert response["choices"][0]["message"]["role"] == "assistant"
        call_id = f"call_{k}"
        self.messages.append(
            {
                "role": "assistant",
                "content": f"Step {k}: reading f{k}.py.",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "read_file", "arguments": f'{{"path": "f{k}.py"}}'},
                    }
                ],
            }
        )
        self.messages.append(
            {"role": "tool", "tool_call_id": call_id, "content": filler(f"{self.run_id}-{k}", 40)}
        )


def vllm_counters(base_url: str) -> Any:
    return read_vllm_metrics(httpx.get(base_url + "/metrics", timeout=10).text, model_name=MODEL)


def chat(
    client: httpx.Client, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> httpx.Response:
    r = client.post(url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=120)
    assert r.status_code == 200, r.text[:500]
    return r


def cached(resp: dict[str, Any]) -> int:
    return int(resp["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.mark.vllm
def test_multistep_run_hits_cache_from_step_2_and_counter_agrees(replicas: list[LocalNode]) -> None:
    node = replicas[0]
    run = AgentRun(f"direct-{uuid.uuid4().hex[:8]}")
    before = vllm_counters(node.base_url)
    usages = []
    with httpx.Client() as c:
        for k in range(5):
            resp = chat(c, node.base_url, run.body()).json()
            usages.append(resp["usage"])
            run.advance(resp, k)
    after = vllm_counters(node.base_url)
    cached_list = [int(u["prompt_tokens_details"]["cached_tokens"]) for u in usages]
    prompts = [int(u["prompt_tokens"]) for u in usages]
    assert cached_list[0] == 0  # a new run's unique system prompt: nothing beyond the first block is shared
    for k in range(1, 5):
        assert cached_list[k] > 0, f"step {k + 1} had no cache hit: {cached_list}"
        assert cached_list[k] % BLOCK == 0  # whole blocks
        assert cached_list[k] < prompts[k]  # vLLM always recomputes at least the last prompt token
        # the previous step's whole prompt is a prefix of this one: at least its full blocks hit
        assert cached_list[k] >= (prompts[k - 1] // BLOCK) * BLOCK
    assert after.prompt_tokens_cached_total - before.prompt_tokens_cached_total == sum(cached_list)
    assert after.prefix_cache_queries_total - before.prefix_cache_queries_total == sum(prompts)
    assert after.prefix_cache_hits_total - before.prefix_cache_hits_total == sum(cached_list)


@pytest.mark.vllm
def test_run_moved_to_other_replica_pays_a_miss(replicas: list[LocalNode]) -> None:
    a, b = replicas
    run = AgentRun(f"moved-{uuid.uuid4().hex[:8]}")
    with httpx.Client() as c:
        for k in range(3):  # warm the run's prefix on replica a
            resp = chat(c, a.base_url, run.body()).json()
            run.advance(resp, k)
        prev_prompt = resp["usage"]["prompt_tokens"]
        on_a = chat(c, a.base_url, run.body()).json()  # the same step, served where the run lives
        b_before = vllm_counters(b.base_url)
        on_b = chat(c, b.base_url, run.body()).json()  # the same step, moved to the cold replica
        b_after = vllm_counters(b.base_url)
        run.advance(on_b, 3)
        again_b = chat(c, b.base_url, run.body()).json()  # the next step stays on b: warm again
    assert on_a["usage"]["prompt_tokens"] == on_b["usage"]["prompt_tokens"]
    assert cached(on_a) >= (prev_prompt // BLOCK) * BLOCK  # where the run lives, its prefix hits
    assert cached(on_b) == 0  # the move lost the whole prefix
    assert (
        b_after.prefix_cache_queries_total - b_before.prefix_cache_queries_total
        == on_b["usage"]["prompt_tokens"]
    )
    assert b_after.prompt_tokens_cached_total == b_before.prompt_tokens_cached_total
    assert cached(again_b) >= (on_b["usage"]["prompt_tokens"] // BLOCK) * BLOCK


def _router_metric(text: str, name: str) -> float:
    return sum(s.value for s in parse_prometheus_text(text) if s.name == name)


@pytest.mark.vllm
def test_run_through_router_stays_on_its_replica_and_metrics_agree(
    replicas: list[LocalNode], tmp_path: Path
) -> None:
    from router.server.app import create_app, serve_in_thread
    from router.server.settings import RouterSettings

    settings = RouterSettings(
        local={"urls": [n.base_url for n in replicas], "model": MODEL, "max_context": 8192},
        policy={"kind": "session-sticky"},
        runlog={"dir": str(tmp_path / "runlog")},
        scrape={"interval_s": 0.5},
        bundle={"watch_s": 0},
    )
    app = create_app(settings)
    before = [vllm_counters(n.base_url) for n in replicas]
    n_runs, n_steps = 2, 4
    served: dict[str, set[str]] = {}
    usages: list[dict[str, Any]] = []
    with serve_in_thread(app) as url, httpx.Client() as c:
        router_before = httpx.get(url + "/metrics", timeout=10).text
        runs = [AgentRun(f"routed-{i}-{uuid.uuid4().hex[:8]}", system_words=400) for i in range(n_runs)]
        for k in range(n_steps):
            for run in runs:
                r = chat(c, url, run.body(model="auto"), headers={"X-Run-Id": run.run_id})
                assert r.headers["x-runroute-tier"] == "local"
                served.setdefault(run.run_id, set()).add(r.headers["x-runroute-replica"])
                resp = r.json()
                usages.append(resp["usage"])
                if k > 0:
                    assert cached(resp) > 0, f"{run.run_id} step {k + 1} missed the cache through the router"
                run.advance(resp, k)
        time.sleep(0.2)
        router_after = httpx.get(url + "/metrics", timeout=10).text
    after = [vllm_counters(n.base_url) for n in replicas]
    assert all(len(reps) == 1 for reps in served.values()), f"a run changed replica: {served}"
    vllm_cached = sum(
        a.prompt_tokens_cached_total - b.prompt_tokens_cached_total
        for a, b in zip(after, before, strict=True)
    )
    router_cached = _router_metric(router_after, "runroute_cache_hit_tokens_total") - _router_metric(
        router_before, "runroute_cache_hit_tokens_total"
    )
    assert vllm_cached == sum(cached({"usage": u}) for u in usages)
    assert router_cached == vllm_cached


# --- without vLLM: launcher argv/env and the metrics parser ------------------------------------------


def _fake_model(tmp_path: Path) -> Path:
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def test_argv_has_the_flags_the_router_relies_on(tmp_path: Path) -> None:
    cfg = LocalNodeConfig(model=str(_fake_model(tmp_path)), port=8123, served_model_name="m", block_size=64)
    argv = build_argv(cfg, "/py")
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--enable-auto-tool-choice"):
        assert flag in argv
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes"
    assert argv[argv.index("--block-size") + 1] == "64"
    assert argv[argv.index("--served-model-name") + 1] == "m"
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--enforce-eager" in argv
    cfg.enforce_eager = False
    assert "--enforce-eager" not in build_argv(cfg, "/py")


def test_env_is_offline_and_binds_one_core_range_per_replica(tmp_path: Path) -> None:
    model = str(_fake_model(tmp_path))
    envs = [
        build_env(
            LocalNodeConfig(model=model, port=1, replica_index=i, state_dir=str(tmp_path / "s")), base={}
        )
        for i in range(2)
    ]
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in envs] == (
        ["0", "1"] if (os.cpu_count() or 1) >= 2 else ["0", "0"]
    )
    for e in envs:
        assert e["HF_HUB_OFFLINE"] == "1" and e["VLLM_NO_USAGE_STATS"] == "1"
        for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
            assert e[key].startswith(str((tmp_path / "s").resolve()))
    assert envs[0]["TMPDIR"] != envs[1]["TMPDIR"]


def test_config_refuses_bad_settings_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(LocalNodeError, match="no config.json"):
        LocalNodeConfig(model=str(tmp_path / "absent"), port=1).check()
    with pytest.raises(LocalNodeError, match="multiple of 32"):
        LocalNodeConfig(model=str(_fake_model(tmp_path)), port=1, block_size=16).check()
    with pytest.raises(LocalNodeError, match="no Python with vllm"):
        find_vllm_python(str(tmp_path / "no-python"))


def test_local_node_reports_a_server_that_dies_before_health(tmp_path: Path) -> None:
    # a "python" that exits at once: the launcher must say so with the log, not wait for the timeout
    fake_py = tmp_path / "py"
    fake_py.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    fake_py.chmod(0o755)
    cfg = LocalNodeConfig(
        model=str(_fake_model(tmp_path)),
        port=_free_port(),
        python=str(fake_py),
        state_dir=str(tmp_path / "s"),
    )
    node = LocalNode(cfg)
    node.start()
    try:
        with pytest.raises(LocalNodeError, match="exited with code 3") as e:
            node.wait_healthy(timeout_s=30)
        assert "boom" in str(e.value)
    finally:
        node.stop()


METRICS_SAMPLE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="local"} 2.0
vllm:num_requests_running{engine="1",model_name="local"} 1.0
vllm:num_requests_running{engine="0",model_name="other"} 7.0
vllm:num_requests_waiting{engine="0",model_name="local"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="local"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="local"} 4000.0
vllm:prefix_cache_hits_total{engine="0",model_name="local"} 3000.0
vllm:prompt_tokens_cached_total{engine="0",model_name="local"} 3000.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="local"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="local"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="local"} 0.5
weird_metric{path="a,b}=\\"q\\"",x="y"} 1e3 1700000000000
"""


def test_metrics_parser_sums_series_of_one_model() -> None:
    m = read_vllm_metrics(METRICS_SAMPLE, model_name="local")
    assert (m.num_requests_running, m.num_requests_waiting, m.kv_cache_usage_perc) == (3.0, 3.0, 0.25)
    assert m.prefix_cache_hit_rate == 0.75 and m.prompt_tokens_cached_total == 3000.0
    assert (m.ttft_count, m.ttft_sum_s) == (4.0, 0.5)
    assert "vllm:e2e_request_latency_seconds" not in m.present
    assert read_vllm_metrics(METRICS_SAMPLE).num_requests_running == 10.0
    weird = [s for s in parse_prometheus_text(METRICS_SAMPLE) if s.name == "weird_metric"][0]
    assert weird.labels == {"path": 'a,b}="q"', "x": "y"} and weird.value == 1000.0


@pytest.mark.parametrize(
    "bad, line",
    [('vllm:x{a="1" 2.0', 1), ("ok 1\nvllm:y{a=1} 2", 2), ("ok 1\n\nz notanumber", 3), ("lonely", 1)],
)
def test_metrics_parser_names_the_bad_line(bad: str, line: int) -> None:
    with pytest.raises(MetricsParseError, match=f"line {line}:"):
        parse_prometheus_text(bad)


FAKE_VLLM_PY = """#!{python}
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_local_node_cli_waits_for_health_and_stops_cleanly_on_signal(tmp_path: Path, sig: int) -> None:
    # a stand-in "python" that serves /health on --port, so the CLI's start/wait/stop path runs without vLLM
    fake_py = tmp_path / "py"
    fake_py.write_text(FAKE_VLLM_PY.format(python=sys.executable))
    fake_py.chmod(0o755)
    port = _free_port()
    cmd = [
        sys.executable,
        "-c",
        "from runroute.cli import app; app()",
        "local-node",
        "--model",
        str(_fake_model(tmp_path)),
    ]
    cmd += ["--port", str(port), "--python", str(fake_py), "--state-dir", str(tmp_path / "s")]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=project_root()
    )
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "ready on" in line or not line:
                break
        assert "ready on" in lines[-1], "".join(lines)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(lines) + out
    assert "stopping" in out
    with pytest.raises(httpx.TransportError):  # the server's process group is gone
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


CHECK_MODEL_PY = """
import json, sys
from transformers import AutoConfig, AutoTokenizer
out = sys.argv[1]
tok = AutoTokenizer.from_pretrained(out)
cfg = AutoConfig.from_pretrained(out)
tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]
p1 = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
call = {"id": "c0", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}}
msgs += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": "text"}]
p2 = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
print(json.dumps({
    "model_type": cfg.model_type,
    "prefix": p2.startswith(p1),
    "tool_call_rendered": '<tool_call>\\n{"name": "read_file", "arguments": {"path": "a"}}\\n</tool_call>' in p2,
    "tool_token_ids": [tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>")],
    "unk": tok.unk_token_id,
    "roundtrip": tok.decode(tok.encode("déjà vu <tool_call> 42", add_special_tokens=False)),
}))
"""


@pytest.mark.vllm
def test_make_test_model_builds_a_llama_with_an_append_only_tool_template(tmp_path: Path) -> None:
    try:
        python = find_vllm_python()
    except LocalNodeError as e:
        _unavailable(f"vllm not importable: {e}")
    out = tmp_path / "model"
    cmd = [sys.executable, "-c", "from runroute.cli import app; app()", "make-test-model", str(out)]
    r = subprocess.run(
        cmd + ["--python", python], capture_output=True, text=True, timeout=300, cwd=project_root()
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parameters" in r.stdout
    manifest = json.loads((out / "runroute-testmodel.json").read_text())
    assert manifest["kind"] == "runroute-testmodel" and manifest["parameters"] < 5_000_000
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (out / name).is_file(), name
    chk = subprocess.run(
        [python, "-c", CHECK_MODEL_PY, str(out)], capture_output=True, text=True, timeout=120
    )
    assert chk.returncode == 0, chk.stderr[-2000:]
    info = json.loads(chk.stdout.strip().splitlines()[-1])
    assert info["model_type"] == "llama"
    assert info["prefix"], "a later turn changed how earlier turns render: prefix caching would miss"
    assert info["tool_call_rendered"]
    assert all(isinstance(i, int) and i != info["unk"] for i in info["tool_token_ids"])
    assert info["roundtrip"] == "déjà vu <tool_call> 42"  # byte-level BPE: any text round-trips
