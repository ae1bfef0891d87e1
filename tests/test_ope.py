"""Off-policy estimators (training.eval.ope): a worked example by hand, unbiasedness and interval
coverage on a toy sequential problem with exact truth, and the refusals of the evaluation job."""

from __future__ import annotations

import numpy as np
import pytest

from training.eval.ope import StepTable, contributions, estimate, run_weights


def worked() -> StepTable:
    # run 1: local (mu .9) then frontier (mu .2); the candidate agrees: local, frontier
    # run 2: local (mu .9) then local (mu .8); the candidate wants the frontier at step 1
    return StepTable(
        ptr=np.array([0, 2, 4]),
        a=np.array([0, 1, 0, 0], dtype=np.int8),
        mu=np.array([0.9, 0.2, 0.9, 0.8]),
        pi=np.array([1.0, 1.0, 1.0, 0.0]),
        pf=np.array([0.0, 1.0, 0.0, 1.0]),
        rewards={"success": np.array([0.0, 1.0, 0.0, 0.0]), "cost": np.array([0.1, 0.5, 0.1, 0.1])},
        q={"success": (np.full(4, 0.3), np.full(4, 0.6))},
    )


def test_worked_example_by_hand():
    t = worked()
    w, prev = run_weights(t)
    assert w == pytest.approx([1 / 0.9, 1 / 0.9 / 0.2, 1 / 0.9, 0.0])
    assert prev == pytest.approx([1.0, 1 / 0.9, 1.0, 1 / 0.9])
    s, c = contributions(t, "success"), contributions(t, "cost")
    # IPS: run 1 5.5556 * 1, run 2 0 -> 2.7778; cost: (1.1111*.1 + 5.5556*.5, 1.1111*.1) -> 1.5
    assert s["ips"].mean() == pytest.approx(25 / 9)
    assert c["ips"].mean() == pytest.approx(1.5)
    # SNIPS: W = (5.5556, 0): success 1.0, cost 0.6
    assert s["snips_num"].sum() / s["snips_den"].sum() == pytest.approx(1.0)
    assert c["snips_num"].sum() / c["snips_den"].sum() == pytest.approx(0.6)
    # DR with Q_L = .3, Q_F = .6: run 1 = -0.03333 + 2.88889, run 2 = -0.03333 + 0.66667
    assert s["dr"] == pytest.approx([2.855556, 0.633333], abs=1e-6)
    assert s["dr"].mean() == pytest.approx(1.744444, abs=1e-6)
    assert c["dr"].tolist() == c["ips"].tolist()  # no cost model: DR is IPS


def toy(n: int, rng: np.random.Generator, eps: float = 0.3) -> tuple[StepTable, float]:
    """Three-step runs; context z ~ U{0,1,2}; logging: epsilon-greedy around "frontier iff z == 2"
    per step (at most one switch is not needed here); reward: success prob depends on z and on
    whether the run escalated, cost per frontier step. Candidate: frontier from step 1 iff z >= 1.
    Returns the table and the candidate's exact value (by enumeration)."""
    K = 3

    def p_succ(z: int, tiers: tuple[int, ...]) -> float:
        return [0.2, 0.4, 0.5][z] + (0.5 if any(tiers) else 0.0) * [0.1, 0.6, 0.8][z]

    def cost(tiers: tuple[int, ...]) -> list[float]:
        return [0.3 if t else 0.02 for t in tiers]

    def cand(z: int, k: int) -> int:
        return int(z >= 1 and k >= 1)

    truth = float(
        np.mean(
            [
                p_succ(z, tuple(cand(z, k) for k in range(K)))
                - sum(cost(tuple(cand(z, k) for k in range(K))))
                for z in range(3)
            ]
        )
    )
    a_all, mu_all, pi_all, pf_all, succ_all, cost_all, ql, qf = [], [], [], [], [], [], [], []
    for _ in range(n):
        z = int(rng.integers(0, 3))
        tiers = []
        for k in range(K):
            greedy = int(z == 2)
            a = greedy if rng.random() > eps else 1 - greedy
            tiers.append(a)
            mu = 1 - eps if a == greedy else eps
            c = cand(z, k)
            a_all.append(a)
            mu_all.append(mu)
            pi_all.append(1.0 if a == c else 0.0)
            pf_all.append(float(c))
        ok = float(rng.random() < p_succ(z, tuple(tiers)))
        succ_all += [0.0] * (K - 1) + [ok]
        cost_all += cost(tuple(tiers))
        # a deliberately crude model: the success rate by action, ignoring z
        ql += [0.35] * K
        qf += [0.6] * K
    t = StepTable(
        ptr=np.arange(0, n * K + 1, K),
        a=np.array(a_all, dtype=np.int8),
        mu=np.array(mu_all),
        pi=np.array(pi_all),
        pf=np.array(pf_all),
        rewards={"success": np.array(succ_all), "cost": np.array(cost_all)},
        q={"success": (np.array(ql), np.array(qf))},
    )
    return t, truth


def test_estimators_unbiased_and_intervals_cover_on_a_toy_problem():
    rng = np.random.default_rng(11)
    vals: dict[str, list[float]] = {"ips": [], "snips": [], "dr": []}
    covered = {"ips": 0, "dr": 0}
    n_sets = 120
    truth = None
    for i in range(n_sets):
        t, truth = toy(400, rng)
        est, _, diag = estimate(
            t, ("success", "cost"), {"net": {"success": 1.0, "cost": -1.0}}, n_boot=200, seed=i
        )
        for e in vals:
            vals[e].append(est[e]["net"].value)
        for e in covered:
            covered[e] += est[e]["net"].covers(truth)
        assert 0 < diag["ess"] <= 400
    assert truth is not None
    for e in ("ips", "dr"):  # unbiased: the mean of many estimates is within 4 SE of the truth
        x = np.array(vals[e])
        assert abs(x.mean() - truth) < 4 * x.std(ddof=1) / np.sqrt(n_sets), (e, x.mean(), truth)
    assert abs(np.mean(vals["snips"]) - truth) < 0.02  # consistent (a small bias at n = 400)
    for e in covered:  # 95% intervals: at least ~88% coverage over 120 sets
        assert covered[e] >= 0.88 * n_sets, (e, covered[e])
    # DR with even a crude model has lower variance than IPS here
    assert np.std(vals["dr"]) < np.std(vals["ips"])


def test_zero_propensity_and_empty_input_are_errors():
    t = worked()
    t.mu[0] = 0.0
    with pytest.raises(ValueError, match="propensity is 0"):
        run_weights(t)
    empty = StepTable(np.array([0]), *(np.zeros(0) for _ in range(4)), rewards={"success": np.zeros(0)})
    with pytest.raises(ValueError, match="no logged runs"):
        estimate(empty, ("success",))


def test_bootstrap_replicates_are_paired_across_candidates():
    from training.eval.ope import bootstrap

    a = bootstrap({"x": np.arange(50.0)}, 50, n_boot=300, seed=3)
    b = bootstrap({"x": np.ones(50)}, 50, n_boot=300, seed=3)
    assert np.array_equal(a["__n"], b["__n"])  # the same run resampling weights for every candidate
    assert np.array_equal(b["x"], b["__n"])  # the replicate sum of ones is the replicate's run count
    # a mean of replicate means is near the sample mean
    assert abs(np.mean(a["x"] / a["__n"]) - 24.5) < 1.0
