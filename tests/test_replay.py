"""Decision replay: escalation figures, recall/precision, flaps and prefix-cache accounting."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from features.runlog import read_runlog, write_records
from features.schema import Run, Step
from models.predictor import FeaturePredictor
from models.types import Predictions
from router.policy import BackendState, build_policy
from router.replay import default_backends, replay

PROMPTS = {
    "pos-1": [1000, 1500, 2100, 2600, 3000, 3600],
    "neg-1": [800, 1200, 1700, 2300, 2900],
    "unl-1": [500, 900, 1300],
    "big-1": [4000, 5000, 6000],  # another model's run: filtered out by weak_model
}
COMPLETION = 50
P = {
    "pos-1": [0.1, 0.1, 0.8, 0.8, 0.8, 0.8],
    "neg-1": [0.1, 0.45, 0.1, 0.45, 0.1],  # inside the learned band, above the per-step threshold
    "unl-1": [0.1, 0.1, 0.1],
    "big-1": [0.9, 0.9, 0.9],
}
LABELS = {"pos-1": True, "neg-1": False, "unl-1": None, "big-1": None}


_BY_PROMPT = {pt: P[rid][k] for rid, prompts in PROMPTS.items() for k, pt in enumerate(prompts)}


class TablePredictor(FeaturePredictor):
    """Stand-in predictor: a p_frontier per (run, step) — keyed by the step's prompt size, unique here."""

    def predict_features(self, x):
        from features.extract import FEATURE_NAMES

        return Predictions(p_frontier=_BY_PROMPT[int(x[FEATURE_NAMES.index("ctx_tokens")])])


def _records():
    recs = []
    for rid, prompts in PROMPTS.items():
        model = "strong" if rid == "big-1" else "weak"
        recs.append(
            Run(run_id=rid, source="test", model=model, needs_frontier=LABELS[rid], n_steps=len(prompts))
        )
        for k, pt in enumerate(prompts):
            recs.append(
                Step(
                    run_id=rid,
                    step=k,
                    arrival_s=10.0 * k,
                    prompt_tokens=pt,
                    completion_tokens=COMPLETION,
                    prefix_reuse_tokens=0 if k == 0 else prompts[k - 1] + COMPLETION,
                    tool_calls=["lookup"],
                    tool_call_keys=[f"{rid}-{k}"],
                    tool_results_n=0 if k == 0 else 1,
                    model=model,
                )
            )
    return recs


@pytest.fixture
def runlog_path(tmp_path):
    return write_records(_records(), tmp_path / "runs.jsonl")  # .parquet: see report (all-null list column)


BACKENDS = [
    BackendState("local-0", "local", "weak", prefill_s_per_token=1e-4),
    BackendState("local-1", "local", "weak", prefill_s_per_token=1e-4),
    BackendState(
        "frontier", "frontier", "strong", price_in_per_m=2.0, price_cached_in_per_m=0.5, price_out_per_m=8.0
    ),
]


def policies():
    return [
        build_policy({"kind": "learned", "p_frontier_up": 0.5, "p_frontier_down": 0.2}),
        build_policy("always-local"),
        build_policy("always-frontier"),
        build_policy({"kind": "per-step-threshold", "threshold": 0.4}),
        build_policy("session-sticky"),
        build_policy("oracle"),
    ]


@pytest.fixture
def report(runlog_path):
    log = read_runlog(runlog_path)
    return replay(log, policies(), TablePredictor(), backends=BACKENDS, weak_model="weak")


def test_replay_counts_runs_labels_and_filters_by_model(report):
    weak = [r for r in PROMPTS if r != "big-1"]
    assert report["runs"] == 3 and report["steps"] == sum(len(PROMPTS[r]) for r in weak)
    assert report["labelled_runs"] == 2 and report["needs_frontier_runs"] == 1
    for r in report["policies"].values():
        assert r["runs"] == 3


def test_oracle_and_learned_escalate_the_needs_frontier_run(report):
    oracle, learned = report["policies"]["oracle"], report["policies"]["learned"]
    assert oracle["escalation_step"] == {"pos-1": 0}
    assert (oracle["recall"], oracle["precision"]) == (1.0, 1.0)
    assert oracle["escalation_rate"] == pytest.approx(1 / 3)
    assert oracle["frontier_step_share"] == pytest.approx(6 / 14)
    # p crosses 0.5 at step 2 (a tool boundary): one switch, kept afterwards
    assert learned["escalation_step"] == {"pos-1": 2}
    assert learned["escalation_step_median"] == 2.0
    assert (learned["recall"], learned["precision"]) == (1.0, 1.0)
    assert learned["switches_per_run"] == pytest.approx(1 / 3) and learned["max_switches"] == 1
    assert learned["reasons"]["escalate"] == 1 and learned["reasons"]["pinned"] >= 1


def test_baselines_without_escalation_have_no_recall(report):
    for name in ("always-local", "session-sticky"):
        r = report["policies"][name]
        assert r["escalation_rate"] == 0.0 and r["recall"] == 0.0 and r["precision"] is None
        assert r["escalation_step"] == {"pos-1": None}
        assert r["frontier_cost_usd"] == 0.0


def test_per_step_threshold_flaps_and_pays_in_re_prefill(report):
    r = report["policies"]["per-step-threshold"]
    assert r["precision"] == 0.5  # the negative run oscillates onto the frontier too
    assert r["runs_with_flaps"] == 1  # neg-1: local/frontier/local/frontier/local
    assert r["tier_switches_per_run"] == pytest.approx((1 + 4) / 3)
    assert r["reprefill_tokens"] > 0 and r["warm_share"] < 1.0
    learned = report["policies"]["learned"]
    assert learned["runs_with_flaps"] == 0


def test_token_accounting_conserves_prompt_tokens_and_sticky_runs_stay_warm(report):
    weak = [r for r in PROMPTS if r != "big-1"]
    total_prompt = sum(sum(PROMPTS[r]) for r in weak)
    reusable = sum(sum(PROMPTS[r][k - 1] + COMPLETION for k in range(1, len(PROMPTS[r]))) for r in weak)
    for name, r in report["policies"].items():
        assert r["warm_tokens"] + r["reprefill_tokens"] + r["new_prefill_tokens"] == total_prompt, name
        assert r["new_prefill_tokens"] == total_prompt - reusable, name
    sticky = report["policies"]["session-sticky"]
    assert (sticky["warm_tokens"], sticky["reprefill_tokens"], sticky["warm_share"]) == (reusable, 0, 1.0)


def test_frontier_cost_follows_the_backend_prices(report):
    weak = [r for r in PROMPTS if r != "big-1"]
    usd = 0.0
    for r in weak:
        prompts = PROMPTS[r]
        for k, pt in enumerate(prompts):
            warm = 0 if k == 0 else prompts[k - 1] + COMPLETION
            usd += (warm * 0.5 + (pt - warm) * 2.0 + COMPLETION * 8.0) / 1e6
    r = report["policies"]["always-frontier"]
    assert r["frontier_cost_usd"] == pytest.approx(usd)
    assert r["frontier_tokens"] == sum(sum(PROMPTS[x]) + COMPLETION * len(PROMPTS[x]) for x in weak)


def test_replay_without_model_filter_and_with_default_backends(runlog_path):
    from router.server.settings import FrontierTier

    log = read_runlog(runlog_path)
    rep = replay(log, [build_policy("always-frontier")], TablePredictor())
    assert rep["runs"] == 4 and rep["backends"] == ["local-0", "local-1", "frontier"]
    bks = default_backends("weak", "strong", n_local=3)
    assert [b.tier for b in bks] == ["local"] * 3 + ["frontier"]
    assert bks[-1].price_in_per_m == FrontierTier.model_fields["price_in_per_m"].default


def test_duplicate_policy_names_are_refused(runlog_path):
    log = read_runlog(runlog_path)
    with pytest.raises(ValueError, match="unique"):
        replay(log, [build_policy("oracle"), build_policy("oracle")], TablePredictor())


# ----------------------------------------------------------------------------- the command


def test_replay_command_prints_a_table_and_writes_json(runlog_path, tmp_path):
    from runroute.cli import _typer_app

    out = tmp_path / "out" / "replay.json"
    cfg = tmp_path / "policies.yaml"
    cfg.write_text("- {kind: per-step-threshold, name: rl-0.3, threshold: 0.3}\n")
    res = CliRunner().invoke(
        _typer_app,
        [
            "replay",
            "--runs",
            str(runlog_path),
            "--policy",
            "oracle,always-local,rl-0.3",
            "--policy-config",
            str(cfg),
            "--weak-model",
            "weak",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    for name in ("oracle", "always-local", "rl-0.3", "esc. rate", "3 runs"):
        assert name in res.output
    data = json.loads(out.read_text())
    assert list(data["policies"]) == ["oracle", "always-local", "rl-0.3"]
    assert data["policies"]["oracle"]["recall"] == 1.0
    assert data["inputs"]["bundle"] is None


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--policy", "nope"], "unknown policy 'nope'"),
        (["--policy", "learned"], "p_frontier_up"),
        (["--policy", "oracle", "--bundle", "/nonexistent-bundle"], "no such bundle"),
    ],
)
def test_replay_command_errors_are_one_line(runlog_path, args, match):
    proc = subprocess.run(
        [sys.executable, "-m", "runroute", "replay", "--runs", str(runlog_path), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert match in proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if ln.startswith("runroute: error")]) == 1


def test_replay_command_with_a_real_bundle(runlog_path, tmp_path):
    from features.extract import N_FEATURES
    from models.bundle import ModelBundle
    from models.escalation import EscalationClassifier
    from runroute.cli import _typer_app

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, N_FEATURES))
    y = (x[:, 0] > 0).astype(int)
    est = EscalationClassifier(n_estimators=5, cv=2, calibration="none", min_child_samples=5).fit(x, y)
    ModelBundle(escalation=est, thresholds={"p_frontier_up": 0.6, "p_frontier_down": 0.3}).save(
        tmp_path / "b"
    )
    out = tmp_path / "r.json"
    res = CliRunner().invoke(
        _typer_app,
        [
            "replay",
            "--runs",
            str(runlog_path),
            "--policy",
            "all",
            "--bundle",
            str(tmp_path / "b"),
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["inputs"]["bundle_version"].startswith("fs-")
    assert set(data["policies"]) == {
        "learned",
        "always-local",
        "always-frontier",
        "per-step-threshold",
        "session-sticky",
        "stall-escalation",
        "oracle",
        "prefix-aware",
    }
    learned = data["policies"]["learned"]
    assert learned["runs"] == 4 and set(learned["reasons"]) <= {
        "first-local",
        "first-frontier",
        "pinned",
        "escalate",
        "de-escalate",
        "hold-cost",
        "hold-dwell",
        "hold-not-boundary",
        "hold-cap",
    }


class HistoryProbe(FeaturePredictor):
    """Records the history features each step sees; p from the step index."""

    def __init__(self):
        self.seen: list[tuple[float, float]] = []

    def predict_features(self, x):
        from features.extract import FEATURE_NAMES

        idx = FEATURE_NAMES.index
        self.seen.append((float(x[idx("step_index")]), float(x[idx("frontier_step_share")])))
        return Predictions(p_frontier=min(1.0, float(x[idx("step_index")]) / 4))


def test_replay_features_see_each_policys_own_history(runlog_path):
    """Replay runs the step engine: a step's features hold the tiers this policy chose before it
    (as live), not the tiers in the log; so the same log gives each policy its own history."""
    log = read_runlog(runlog_path)
    local, frontier = HistoryProbe(), HistoryProbe()
    replay(log, [build_policy({"kind": "always-local"})], local, backends=BACKENDS)
    replay(log, [build_policy({"kind": "always-frontier"})], frontier, backends=BACKENDS)
    assert all(share == 0.0 for _, share in local.seen)
    assert all(share == (1.0 if k > 0 else 0.0) for k, share in frontier.seen)
    per_step = replay(log, policies(), HistoryProbe(), backends=BACKENDS)
    assert per_step["policies"]["per-step-threshold"]["escalation_rate"] == 1.0  # every run reaches step 2


def test_replay_reads_the_prefix_index_where_the_log_has_block_chains(tmp_path):
    """Rows with ``hash_ids`` are read through the prefix index (one per policy): a run whose
    first step shares a leading block chain with an earlier run is warm on the replica that holds
    it under prefix-aware placement (reuse across runs, which the run-own model cannot see), and
    the same log without the chains counts none of it."""
    recs = [Run(run_id=r, source="test", model="weak", n_steps=2) for r in ("a", "b")]
    rows = {
        "a": [(1600, [1, 2, 3], 0), (2600, [1, 2, 3, 4, 5], 1600)],
        "b": [(1600, [1, 2, 9], 1024), (2600, [1, 2, 9, 10, 11], 1600)],
    }
    for rid, steps in rows.items():
        for k, (pt, chain, reuse) in enumerate(steps):
            recs.append(
                Step(
                    run_id=rid,
                    step=k,
                    arrival_s=100.0 * (rid == "b") + 10.0 * k,
                    prompt_tokens=pt,
                    completion_tokens=COMPLETION,
                    prefix_reuse_tokens=reuse,
                    hash_ids=chain,
                    model="weak",
                )
            )
    log = read_runlog(write_records(recs, tmp_path / "chains.jsonl"))
    pol = [build_policy("prefix-aware"), build_policy("always-local")]
    rep = replay(log, pol, TablePredictorAny(), backends=BACKENDS, weak_model="weak")["policies"]
    # a's 2nd step: 3 blocks held; b's 1st: 2 shared blocks; b's 2nd: its 3 blocks of step 1
    assert rep["prefix-aware"]["warm_tokens"] == (3 + 2 + 3) * 512
    assert rep["prefix-aware"]["reprefill_tokens"] == 1600 + 1024 + 1600 - (3 + 2 + 3) * 512
    for r in recs:
        if isinstance(r, Step):
            r.hash_ids = None
    plain = read_runlog(write_records(recs, tmp_path / "plain.jsonl"))
    rep0 = replay(plain, pol, TablePredictorAny(), backends=BACKENDS, weak_model="weak")["policies"]
    assert rep0["prefix-aware"]["warm_tokens"] < rep["prefix-aware"]["warm_tokens"]
    assert rep0["prefix-aware"]["by_tier"]["local"]["warm_tokens"] == rep0["prefix-aware"]["warm_tokens"]


class TablePredictorAny(FeaturePredictor):
    def predict_features(self, x):
        return Predictions(p_frontier=0.0)
