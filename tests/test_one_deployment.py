"""serve, whatif and bench, given no price / SLO / KV flags, describe the same deployment.

serve reads a config file (one frontier tier, nothing else set); whatif and bench are read from
their CLI option defaults and the configs they build from them (``SimConfig`` / ``FrontierConfig``
for whatif, ``Prices`` / ``SimSettings`` for bench). Every figure must equal the one in
``router.policy.defaults``.
"""

from __future__ import annotations

import typer

from router.policy import defaults as d
from router.policy.config import build_policy
from router.server.settings import RouterSettings
from router.sim.frontier import FrontierConfig
from router.sim.simconfig import SimConfig
from runroute.cli import _typer_app
from training.eval.config import SimSettings
from training.eval.outcome import Prices


def _option_defaults(command: str) -> dict[str, object]:
    group = typer.main.get_command(_typer_app)
    cmd = group.commands[command]  # type: ignore[attr-defined]
    return {p.name: p.default for p in cmd.params if p.name}


def test_serve_whatif_and_bench_report_the_same_prices_slo_and_kv(tmp_path):
    cfg = tmp_path / "runroute.yaml"
    cfg.write_text(
        "frontier:\n  url: http://127.0.0.1:9\n  allow_no_key: true\n"
        "policy: session-sticky\n"  # learned needs a bundle; its GPU price is the policy config's default
    )
    s = RouterSettings.load(cfg)
    assert s.frontier is not None
    serve = {
        "in": s.frontier.price_in_per_m,
        "cached_in": s.frontier.price_cached_in_per_m,
        "out": s.frontier.price_out_per_m,
        "gpu_hour": build_policy(
            {"kind": "learned", "p_frontier_up": 0.5, "p_frontier_down": 0.2}
        ).local_gpu_usd_per_hour,  # type: ignore[attr-defined]
        "slo_short": s.admission.slo_short_step_s,
    }

    w = _option_defaults("whatif")
    fr = FrontierConfig()  # whatif builds it with no price kwargs when --frontier-price is unset
    sim_kv = SimConfig.__dataclass_fields__["kv_cache_gb"].default  # whatif's KV fallback is this constant
    whatif = {
        "in": fr.price_in_per_m,
        "cached_in": fr.price_cached_in_per_m,
        "out": fr.price_out_per_m,
        "gpu_hour": w["gpu_hour_usd"],
        "slo_short": w["slo_short_s"],
    }

    b = _option_defaults("bench")
    p, sim = Prices(), SimSettings()  # bench's figures when --frontier-price / --gpu-hour-usd are unset
    assert b["frontier_price"] in (None, "") and b["gpu_hour_usd"] is None
    bench = {
        "in": p.frontier_in_per_m,
        "cached_in": p.frontier_cached_in_per_m,
        "out": p.frontier_out_per_m,
        "gpu_hour": p.gpu_hour_usd,
        "slo_short": sim.slo_short_s,
    }

    want = {
        "in": d.FRONTIER_IN_PER_M,
        "cached_in": d.FRONTIER_CACHED_IN_PER_M,
        "out": d.FRONTIER_OUT_PER_M,
        "gpu_hour": d.GPU_HOUR_USD,
        "slo_short": d.SLO_SHORT_STEP_S,
    }
    assert serve == whatif == bench == want
    assert b["kv_cache_gb"] == sim_kv == d.KV_CACHE_GB
    # long steps' TTFT SLO: the sidecar's slo.ttft_s, whatif's --slo-ttft-s, the evaluation's
    assert s.slo.ttft_s == w["slo_ttft_s"] == sim.slo_ttft_s == d.SLO_TTFT_S


ONE_FILE = """\
local:
  urls: [http://10.0.0.5:8000, http://10.0.0.6:8000]
  gpu_usd_per_hour: 2.75
frontier:
  url: http://127.0.0.1:9
  allow_no_key: true
  price_in_per_m: 3.0
  price_cached_in_per_m: 0.3
  price_out_per_m: 15.0
node:
  gpu: h100
  kv_cache_gb: 40.0
slo:
  ttft_s: 3.5
  step_latency_s: 12.0
admission:
  slo_short_step_s: 1.25
policy: session-sticky
"""


def test_one_config_gives_serve_whatif_and_bench_the_same_deployment(tmp_path, monkeypatch):
    """One file: the sidecar's settings, whatif's simulated node and bench's simulated deployment and
    prices report the same prices, GPU price, SLOs, KV size and replicas, all the file's."""
    import os

    from router.sim.profiles import load_profile
    from runroute.deployconfig import resolve
    from training.eval.config import prices_for

    for k in list(os.environ):
        if k.upper().startswith("RUNROUTE_"):
            monkeypatch.delenv(k)
    cfg = tmp_path / "runroute.yaml"
    cfg.write_text(ONE_FILE)

    s = RouterSettings.load(cfg)
    dep = resolve(cfg).deployment  # what every other command reads
    assert s.deployment() == dep
    assert s.frontier is not None and s.local is not None
    serve = {
        "prices": (s.frontier.price_in_per_m, s.frontier.price_cached_in_per_m, s.frontier.price_out_per_m),
        "gpu_hour": s.local.gpu_usd_per_hour,
        "slo": (s.admission.slo_short_step_s, s.slo.ttft_s, s.slo.step_latency_s),
        "kv": s.node.kv_cache_gb,
        "replicas": len(s.local.urls),
    }

    sim = SimConfig.for_deployment(dep, load_profile(dep.node.profile, dep.node.gpu))
    whatif = {
        "prices": (
            sim.frontier.price_in_per_m,
            sim.frontier.price_cached_in_per_m,
            sim.frontier.price_out_per_m,
        ),
        "gpu_hour": sim.gpu_hour_usd,
        "slo": (sim.slo_short_s, sim.slo_ttft_s, dep.slo.step_latency_s),
        "kv": sim.kv_cache_gb,
        "replicas": sim.replicas,
    }

    p, b = prices_for(dep), SimSettings.from_deployment(dep)
    bench = {
        "prices": (p.frontier_in_per_m, p.frontier_cached_in_per_m, p.frontier_out_per_m),
        "gpu_hour": p.gpu_hour_usd,
        "slo": (b.slo_short_s, b.slo_ttft_s, dep.slo.step_latency_s),
        "kv": b.kv_cache_gb,
        "replicas": b.replicas,
    }
    want = {"prices": (3.0, 0.3, 15.0), "gpu_hour": 2.75, "slo": (1.25, 3.5, 12.0), "kv": 40.0, "replicas": 2}
    assert serve == whatif == bench == want
    assert b.gpu == sim.profile.name.split("-")[0] == "h100"


def test_env_overrides_reach_serve_and_the_other_commands_alike(tmp_path, monkeypatch):
    """RUNROUTE_* variables over the file: the sidecar (pydantic-settings) and the commands'
    resolver (runroute.deployconfig) read the same deployment."""
    import os

    from runroute.deployconfig import resolve

    for k in list(os.environ):
        if k.upper().startswith("RUNROUTE_"):
            monkeypatch.delenv(k)
    cfg = tmp_path / "runroute.yaml"
    cfg.write_text(ONE_FILE)
    monkeypatch.setenv("RUNROUTE_NODE__KV_CACHE_GB", "24")
    monkeypatch.setenv("RUNROUTE_SLO__TTFT_S", "6.5")
    monkeypatch.setenv("RUNROUTE_ADMISSION__SLO_SHORT_STEP_S", "1.75")
    monkeypatch.setenv("RUNROUTE_FRONTIER__PRICE_OUT_PER_M", "12")
    serve = RouterSettings.load(cfg).deployment()
    r = resolve(cfg)
    assert serve == r.deployment
    assert (serve.node.kv_cache_gb, serve.slo.ttft_s, serve.slo_short_step_s) == (24.0, 6.5, 1.75)
    assert serve.frontier.price_out_per_m == 12.0 and serve.frontier.price_in_per_m == 3.0
    assert r.sources["frontier.price_out_per_m"] == "env RUNROUTE_FRONTIER__PRICE_OUT_PER_M"
