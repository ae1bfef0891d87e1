"""The step price is written once (router.core.accounting) and every consumer charges what it says."""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from router.core.accounting import backend_step_usd, gpu_usd, token_usd
from router.core.explore import step_price_usd
from router.policy.types import BackendState
from router.sim.frontier import Frontier, FrontierConfig
from training.eval.ope_replay import step_costs
from training.eval.outcome import FRONTIER, LOCAL, Prices, RunRecord, run_costs

ROOT = Path(__file__).resolve().parents[1]
PRICES = {"price_in_per_m": 2.0, "price_cached_in_per_m": 0.5, "price_out_per_m": 8.0}


def test_token_price_by_hand_and_scalar_equals_array():
    # 600 fresh x $2 + 400 cached x $0.5 + 100 out x $8 per M
    assert token_usd(1000.0, 400.0, 100.0, **PRICES) == pytest.approx(2200 / 1e6)
    arr = token_usd(np.array([1000.0, 50.0]), np.array([400.0, 0.0]), np.array([100.0, 7.0]), **PRICES)
    assert arr.tolist() == [token_usd(1000.0, 400.0, 100.0, **PRICES), token_usd(50.0, 0.0, 7.0, **PRICES)]
    # cache writes (Anthropic-style): 200 fresh x $3 + 800 written x $3.75 + 10 out x $15
    w = token_usd(
        1000.0,
        0.0,
        10.0,
        price_in_per_m=3.0,
        price_cached_in_per_m=0.3,
        price_out_per_m=15.0,
        cache_write=800.0,
        price_cache_write_per_m=3.75,
    )
    assert w == pytest.approx((200 * 3.0 + 800 * 3.75 + 10 * 15.0) / 1e6)
    assert gpu_usd(1800.0, 1.5, gpus=2) == pytest.approx(1.5)


def test_engine_budget_and_backend_price_are_the_same_function():
    b = BackendState("f", "frontier", "strong", **PRICES)
    assert step_price_usd(b, 1000, 400, 100) == backend_step_usd(b, 1000, 400, 100)
    assert backend_step_usd(b, 1000, 400, 100) == token_usd(1000.0, 400.0, 100.0, **PRICES)
    local = BackendState("l", "local", "weak")
    assert backend_step_usd(local, 1000, 0, 100) == 0.0


def test_simulated_frontier_charges_the_accounting_price():
    fr = Frontier(FrontierConfig(cache_min_tokens=16), random.Random(0), block_tokens=16)
    total = 0.0
    hits = []
    for k, prompt in enumerate((128, 160, 192)):
        chain = list(range(prompt // 16))
        _, _, cached, cost = fr.serve(0, prompt, 20, chain, len(chain), len(chain), 10.0 * k)
        assert cost == token_usd(float(prompt), float(cached), 20.0, **PRICES)
        hits.append(cached)
        total += cost
    assert hits[0] == 0 and hits[1] > 0  # the cached price was exercised
    assert fr.cost_usd == pytest.approx(total)


def test_outcome_run_costs_equal_the_sum_of_ope_step_costs():
    rec = RunRecord.make(
        "r", [1000, 1500, 2200, 2600, 3000], [100, 120, 80, 60, 90], [0, 1100, 1620, 2280, 2660]
    )
    prices = Prices()
    for tiers in ([LOCAL] * 5, [FRONTIER] * 5, [LOCAL, FRONTIER, FRONTIER, LOCAL, LOCAL]):
        t = np.array(tiers)
        total, local, frontier = run_costs(rec, t, prices)
        per_step = step_costs(rec, t, prices)
        assert total == pytest.approx(float(per_step.sum()), rel=1e-12)
        assert frontier == pytest.approx(float(per_step[t == FRONTIER].sum()), rel=1e-12)
        assert local == pytest.approx(float(per_step[t == LOCAL].sum()), rel=1e-12)
    # all frontier: step 0 cold, then the previous step's reuse is read at the cached price
    by_hand = sum(
        (p - w) * prices.frontier_in_per_m
        + w * prices.frontier_cached_in_per_m
        + c * prices.frontier_out_per_m
        for p, w, c in zip(rec.prompt, [0, 1100, 1620, 2280, 2660], rec.completion, strict=True)
    )
    assert run_costs(rec, np.array([FRONTIER] * 5), prices)[2] == pytest.approx(by_hand / 1e6)


# ``x price_..._per_m`` (or ``price_..._per_m x``) outside the accounting module is a second copy
# of the step price. router/policy/learned.py is the policy's expected per-token loss (a decision
# model below router.core, not a bill) and may name the prices.
_NAME = r"[\w.]*(price_\w+_per_m|_in_per_m|_out_per_m|gpu_hour_usd)\b"
_PRICE_TERM = re.compile(rf"(\*\s*{_NAME})|({_NAME}\s*\*)")
_ALLOWED = {"router/core/accounting.py", "router/policy/learned.py"}


def test_no_second_copy_of_the_step_price_in_the_tree():
    copies = []
    for pkg in ("router", "training", "runroute", "models", "features"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in _ALLOWED:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _PRICE_TERM.search(line):
                    copies.append(f"{rel}:{n}: {line.strip()}")
    assert copies == []
