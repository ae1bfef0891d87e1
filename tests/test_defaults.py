"""Each deployment default (GPU price, frontier prices, SLOs, KV size) is written once.

A field of one of these concepts given a non-zero number as its default anywhere in the tree
(outside tests) is a second copy that can drift; the one copy is router/policy/defaults.py.
A 0 default is a sentinel ("carries none": a local backend's token prices), not a price.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from router.policy import defaults
from router.policy.admission import AdmissionConfig
from router.policy.deployment import Deployment
from router.policy.learned import LearnedPolicy
from router.server.metrics.registry import RouterMetrics
from router.server.settings import SLOSettings
from router.server.settings_tiers import FrontierTier
from router.sim.frontier import FrontierConfig
from router.sim.simconfig import SimConfig
from training.eval.config import SimSettings
from training.eval.outcome import Prices

ROOT = Path(__file__).resolve().parents[1]
_NUM = r"(?!0+(\.0+)?(?![\d.]))\d+(\.\d+)?\b"  # a number that is not zero
_TYPE = r"(\s*:\s*(Annotated\[.*?\]|[\w.\[\] |]+?))?"  # an annotation, if any
_VALUE = rf"{_TYPE}\s*=\s*(typer\.Option\(\s*|Field\(\s*(default=)?)?{_NUM}"
CONCEPTS = {
    "GPU price per hour": r"gpu_hour_usd|gpu_usd_per_hour|local_gpu_usd_per_hour",
    "frontier input price": r"price_in_per_m|frontier_in_per_m",
    "frontier cached input price": r"price_cached_in_per_m|frontier_cached_in_per_m",
    "frontier output price": r"price_out_per_m|frontier_out_per_m",
    "frontier cache write price": r"price_cache_write_per_m|frontier_cache_write_per_m",
    "short-step SLO": r"slo_short_s|slo_short_step_s",
    "TTFT SLO": r"slo_ttft_s|ttft_s|ttft_slo_s",
    "step latency SLO": r"step_latency_s|step_slo_s|slo_step_s",
    "short-step tokens": r"short_step_tokens",
    "KV cache GB": r"kv_cache_gb",
}


def _hits(names: str) -> list[str]:
    pat = re.compile(rf"\b({names})\b{_VALUE}", re.IGNORECASE)
    out = []
    for pkg in ("router", "training", "runroute", "models", "features"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            text = re.sub(r"\(\s*\n\s*", "(", path.read_text())  # a Field( broken over lines
            for n, line in enumerate(text.splitlines(), 1):
                if pat.search(line):
                    out.append(f"{path.relative_to(ROOT).as_posix()}:{n}")
    return out


@pytest.mark.parametrize("concept", sorted(CONCEPTS))
def test_each_default_literal_is_written_once(concept):
    hits = _hits(CONCEPTS[concept])
    assert len(hits) == 1 and hits[0].startswith("router/policy/defaults.py:"), hits


def test_the_pattern_finds_a_copy():
    pat = re.compile(rf"\b({CONCEPTS['GPU price per hour']})\b{_VALUE}", re.IGNORECASE)
    assert pat.search("    gpu_hour_usd: float = 0.20")
    assert pat.search('gpu_hour_usd: float = typer.Option(0.20, "--gpu-hour-usd")')
    assert pat.search("    gpu_usd_per_hour: float = Field(default=1.5, ge=0)")
    assert not pat.search("    gpu_usd_per_hour: float = Field(default=0.0, ge=0)")


def test_sidecar_simulator_and_evaluation_default_to_the_same_deployment():
    d = defaults
    front = FrontierTier(url="http://127.0.0.1:1", allow_no_key=True)
    assert (front.price_in_per_m, front.price_cached_in_per_m, front.price_out_per_m) == (
        d.FRONTIER_IN_PER_M,
        d.FRONTIER_CACHED_IN_PER_M,
        d.FRONTIER_OUT_PER_M,
    )
    sim_front = FrontierConfig()
    assert (sim_front.price_in_per_m, sim_front.price_cached_in_per_m, sim_front.price_out_per_m) == (
        front.price_in_per_m,
        front.price_cached_in_per_m,
        front.price_out_per_m,
    )
    p = Prices()
    assert (p.frontier_in_per_m, p.frontier_cached_in_per_m, p.frontier_out_per_m) == (
        front.price_in_per_m,
        front.price_cached_in_per_m,
        front.price_out_per_m,
    )
    assert (
        p.gpu_hour_usd
        == LearnedPolicy(p_frontier_up=0.5, p_frontier_down=0.2).local_gpu_usd_per_hour
        == d.GPU_HOUR_USD
    )
    sim_fields = SimConfig.__dataclass_fields__
    assert sim_fields["gpu_hour_usd"].default == d.GPU_HOUR_USD
    assert sim_fields["slo_short_s"].default == AdmissionConfig().slo_short_step_s == d.SLO_SHORT_STEP_S
    assert sim_fields["kv_cache_gb"].default == SimSettings().kv_cache_gb == d.KV_CACHE_GB
    assert SimSettings().slo_short_s == d.SLO_SHORT_STEP_S


def test_the_ttft_and_step_slos_agree_across_sidecar_simulator_metrics_and_evaluation():
    d = defaults
    sidecar = SLOSettings()
    assert sidecar.ttft_s == SimConfig.__dataclass_fields__["slo_ttft_s"].default == SimSettings().slo_ttft_s
    assert sidecar.ttft_s == Deployment().slo.ttft_s == d.SLO_TTFT_S
    m = RouterMetrics()
    assert m.step_slo_s == sidecar.step_latency_s == d.SLO_STEP_S
    assert m.short_step_tokens == sidecar.short_step_tokens == d.SHORT_STEP_TOKENS


def test_the_pattern_finds_a_second_ttft_slo():
    pat = re.compile(rf"\b({CONCEPTS['TTFT SLO']})\b{_VALUE}", re.IGNORECASE)
    assert pat.search("    ttft_s: float = Field(default=1.0, gt=0)")
    assert pat.search('slo_ttft_s: float = typer.Option(5.0, "--slo-ttft-s")')
    assert not pat.search("    frontier_ttft_s: float = 0.4")
