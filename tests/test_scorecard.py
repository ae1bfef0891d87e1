"""The typed scorecard: every field documented, the README's key list generated and current, the
what-if rows in step with router.sim, and real comparison output validating against the models."""

from __future__ import annotations

from pathlib import Path

import pytest

from features.runlog import RunLog
from training.eval import readme_keys
from training.eval.scorecard import PolicyRow, Scorecard, SetResult, WhatIfRow

README = Path(__file__).resolve().parents[1] / "docs" / "scorecard.md"  # generated there (issue 27)


def test_every_documented_field_has_a_description():
    models = readme_keys.documented_models()
    assert {Scorecard, SetResult, PolicyRow, WhatIfRow} <= set(models)
    for m in models:
        for name, f in m.model_fields.items():
            assert f.description and f.description.strip(), f"{m.__name__}.{name} has no description"
        only = getattr(m, "ONLY_WHEN_SET", frozenset())
        assert only <= set(m.model_fields), f"{m.__name__}.ONLY_WHEN_SET names unknown fields"


def test_readme_key_list_is_generated_and_current():
    text = README.read_text()
    assert text.count(readme_keys.BEGIN) == 1 and text.count(readme_keys.END) == 1
    assert readme_keys.update_readme(text) == text, f"README is stale: run {readme_keys.COMMAND}"
    block = readme_keys.readme_block()
    # a key from each level of the scorecard and one what-if key, with its description
    for key in ("`sets.<set>`", "`policies[]`", "`aiq`", "`sweeps.<policy>[]`", "`slo_attainment`"):
        assert key in block
    assert PolicyRow.model_fields["aiq"].description.split()[0] in block


def test_readme_keys_check_and_write(tmp_path):
    stale = tmp_path / "README.md"
    stale.write_text(f"# x\n\n{readme_keys.BEGIN}\nold list\n{readme_keys.END}\n\nrest\n")
    assert readme_keys.main(["--check", str(stale)]) == 1
    assert readme_keys.main(["--write", str(stale)]) == 0
    assert readme_keys.main(["--check", str(stale)]) == 0
    text = stale.read_text()
    assert "old list" not in text and text.startswith("# x\n") and text.endswith("\n\nrest\n")
    nomark = tmp_path / "other.md"
    nomark.write_text("no block\n")
    with pytest.raises(ValueError, match="scorecard-keys"):
        readme_keys.main(["--check", str(nomark)])


def test_whatif_rows_match_the_simulators_scorecard():
    from features.generate import generate
    from router.policy.config import build_policy
    from router.sim.arrivals import run_starts
    from router.sim.profiles import load_profile
    from router.sim.whatif import SCORECARD_KEYS, SimConfig, Simulator, Workload, scorecard

    assert tuple(WhatIfRow.model_fields) == tuple(SCORECARD_KEYS)
    log = RunLog.from_frame(generate(12, seed=3))
    wl = Workload.from_frames(log.steps, log.runs)
    starts = run_starts("rate=0.5", len(wl.runs), seed=0, mean_steps_per_run=wl.mean_steps_per_run())
    cfg = SimConfig(profile=load_profile(None, "a100"), replicas=1)
    res = Simulator(wl, build_policy({"kind": "always-local"}, None), cfg, starts).run()
    res.policy = "always-local"
    row = WhatIfRow.model_validate(scorecard(res))
    assert row.runs_completed == len(wl.runs) and row.policy == "always-local"


def test_compare_policies_returns_validated_rows_without_a_bundle():
    from features.generate import generate
    from training.eval.compare import compare_policies
    from training.eval.config import SimSettings
    from training.eval.outcome import Prices

    log = RunLog.from_frame(generate(15, seed=5))
    res = compare_policies(
        log.runs,
        log.steps,
        bundle=None,
        prices=Prices(),
        sim=SimSettings(arrival_rate=0.5),
        sweep_thresholds=[0.5],
    )
    labels = [r.policy for r in res.policies]
    assert "learned" not in labels and "per-step-threshold" not in labels and "always-local" in labels
    assert res.sweeps == {} and res.n_runs == 15
    dumped = res.model_dump()
    assert "model_scores" not in dumped  # set by the demo only
    assert all("thresholds" not in r for r in dumped["policies"])  # no threshold policy ran
    assert SetResult.model_validate(dumped) == res
    # every AIQ carries its task-bootstrap interval; without per-step-threshold no paired figures
    for r in res.policies:
        if r.aiq is not None:
            assert r.aiq_ci_low is not None and r.aiq_ci_low <= r.aiq + 1e-9 <= r.aiq_ci_high + 2e-9, r
        assert r.success_diff_vs_ref is None
