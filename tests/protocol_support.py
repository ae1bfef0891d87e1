"""Helpers of the protocol and client tests (tests/test_clients_*.py, test_translate.py,
test_lifecycle.py): the sidecar's settings over the protocol fakes, a sidecar on loopback whose run
log can be read back after it stops. The fixtures (``small_bundle``, ``proto_fakes``, ``sidecar``)
are in conftest.py."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from router.server.app import create_app, serve_in_thread
from router.server.settings import RouterSettings

__all__ = ["TOOL_SCHEMA", "sidecar_settings", "running_sidecar", "read_steps"]

TOOL_SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}


def sidecar_settings(tmp_path: Path, fakes: dict[str, Any], bundle: Path, **over: Any) -> RouterSettings:
    os.environ["RR_TEST_OA_KEY"] = "sk-oa"
    os.environ["RR_TEST_AN_KEY"] = "sk-an"
    base: dict[str, Any] = {
        "local": {"urls": [fakes["v0"].url, fakes["v1"].url], "model": "local-model", "max_context": 200000},
        "frontiers": [
            {
                "kind": "openai",
                "name": "openai",
                "url": fakes["openai"].url,
                "model": "frontier-model",
                "api_key_env": "RR_TEST_OA_KEY",
                "models": ["gpt-*"],
                "default": True,
            },
            {
                "kind": "anthropic",
                "name": "claude",
                "url": fakes["anthropic"].url,
                "model": "claude-fake",
                "api_key_env": "RR_TEST_AN_KEY",
                "models": ["claude-*"],
                "price_in_per_m": 3.0,
                "price_cached_in_per_m": 0.3,
                "price_cache_write_per_m": 3.75,
                "price_out_per_m": 15.0,
            },
        ],
        "policy": {"kind": "learned"},
        "bundle": {"path": str(bundle), "watch_s": 0},
        "scrape": {"interval_s": 0},
        "runlog": {"dir": str(tmp_path / "logs")},
    }
    base.update(over)
    return RouterSettings.load(None, **base)


@contextlib.contextmanager
def running_sidecar(settings: RouterSettings, **kw: Any):
    """``(url, app)`` of a sidecar on loopback; the run log is flushed when the block exits."""
    app = create_app(settings, **kw)
    with serve_in_thread(app) as url:
        yield url, app


def read_steps(tmp_path: Path):
    from features.runlog import read_runlog

    return read_runlog(sorted((tmp_path / "logs").glob("runlog-*")))
