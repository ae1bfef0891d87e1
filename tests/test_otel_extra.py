"""`runroute[otel]` installs what `tracing.exporter: otlp` needs, and a tracing config the app
cannot build exits 2 with one line, like every other config error (issue 27)."""

from __future__ import annotations

import subprocess
import sys


def test_otel_extra_names_the_sdk_and_the_otlp_exporter():
    from importlib.metadata import requires

    otel = [r for r in requires("runroute") or [] if 'extra == "otel"' in r]
    names = {r.split(";")[0].split(">")[0].split("<")[0].split("=")[0].strip() for r in otel}
    assert {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"} <= names, otel


def test_otlp_exporter_builds_from_the_installed_packages():
    from router.server.settings import RouterSettings
    from router.server.tracing import make_tracing

    s = RouterSettings.load(
        None,
        local={"urls": ["http://127.0.0.1:9"]},
        policy={"kind": "always-local"},
        tracing={"enabled": True, "exporter": "otlp", "endpoint": "http://127.0.0.1:9/v1/traces"},
    )
    t = make_tracing(s)
    assert t is not None
    t.shutdown()


def test_tracing_config_the_app_cannot_build_exits_2(tmp_path):
    cfg = tmp_path / "runroute.yaml"
    cfg.write_text(
        "local: {urls: ['http://127.0.0.1:9']}\npolicy: {kind: always-local}\ntracing: {enabled: true, exporter: otlp}\n"
    )
    code = (
        "import sys; sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None\n"
        f"sys.argv = ['runroute', 'serve', '--config', {str(cfg)!r}, '--port', '0']\n"
        "from runroute.cli import app; app()\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2, (p.stdout[-500:], p.stderr[-1500:])
    assert (
        p.stderr.strip().splitlines()[-1].startswith("runroute: error: config: tracing.exporter otlp needs")
    )
