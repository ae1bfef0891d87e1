"""The benefit target end to end: tau2 file shapes, per-run labels, the evidence gate, the bundle's
benefit fields and the learned policy's benefit rule. Real importers, real logistic heads, real
LightGBM in the bundle."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from features.importers.pairing import label_domain_runs
from features.importers.tau2bench import import_tau2bench
from features.prefix import RunPrefix
from models.benefit import UNSEEN_REASON
from training.benefit import BenefitConfig, BenefitRows, fit_benefit

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "data" / "tau2bench"


def _sim(task: str, reward: float | None) -> dict:
    return {
        "task_id": task,
        "trial": 0,
        "reward_info": None if reward is None else {"reward": reward},
        "messages": [
            {"role": "assistant", "content": "Hi!", "turn_idx": 0},
            {"role": "user", "content": f"please cancel booking {task}", "turn_idx": 1},
            {
                "role": "assistant",
                "content": "done",
                "turn_idx": 2,
                "usage": {"prompt_tokens": 900, "completion_tokens": 5},
            },
        ],
    }


def test_importer_reads_bare_list_and_community_shapes(tmp_path):
    (tmp_path / "agent-x_team__retail_1trial.json").write_text(json.dumps([_sim("1", 1.0), _sim("2", 0.0)]))
    (tmp_path / "agent-y_team__telecom_cascata.json").write_text(
        json.dumps(
            {
                "domain": "telecom",
                "agent": "a",
                "model": "vendor/m-1",
                "simulations": [_sim("1", 0.0), _sim("2", None)],
            }
        )
    )
    bad: list = []
    df = import_tau2bench(tmp_path, bad_rows=bad)
    runs = df[df["record"] == "run"].set_index("run_id")
    assert sorted(runs["task_id"]) == ["retail/1", "retail/2", "telecom/1"]
    assert set(runs.loc[runs["task_id"].str.startswith("retail"), "agent"]) == {"agent-x_team"}
    assert set(runs.loc[runs["task_id"].str.startswith("telecom"), "model"]) == {"m-1"}
    assert len(bad) == 1 and "reward" in bad[0].reason  # the simulation without a reward is reported


def _runs(rows: list[tuple[str, str, str, str]]) -> pd.DataFrame:
    from features.runlog import records_to_frame

    return records_to_frame(
        [
            {
                "record": "run",
                "run_id": f"{a}-{m}-{t}",
                "source": "tau2bench",
                "task_id": t,
                "agent": a,
                "model": m,
                "outcome": o,
            }
            for a, m, t, o in rows
        ]
    )


def test_per_run_labels_never_call_a_successful_weak_run_needs_frontier():
    rows = [
        # strong player: succeeds on both tasks
        ("best", "s", "airline/1", "success"),
        ("best", "s", "airline/2", "success"),
        # weak player, two trials of task 1: one succeeds, one fails (the task majority is a tie)
        ("weak", "w", "airline/1", "success"),
        ("weak2", "w", "airline/1", "failure"),
        ("weak", "w", "airline/2", "failure"),
    ]
    out = label_domain_runs(_runs(rows)).set_index("run_id")
    assert out.loc["weak-w-airline/1", "pair_label"] == "weak_ok"
    assert bool(out.loc["weak-w-airline/1", "needs_frontier"]) is False
    assert out.loc["weak2-w-airline/1", "pair_label"] == "needs_frontier"
    assert out.loc["weak-w-airline/2", "strong_outcome"] == "success"
    assert out.loc["weak-w-airline/2", "strong_model"] == "best/s"
    assert pd.isna(out.loc["best-s-airline/1", "pair_label"])  # the strong player's own runs stay unlabelled
    # roles are configurable: weak2 as the only weak player leaves "weak" unlabelled
    only = label_domain_runs(_runs(rows), weak=("weak2",)).set_index("run_id")
    assert pd.isna(only.loc["weak-w-airline/2", "pair_label"])


def _rows(n_tasks: int, signal: bool, domain: str, seed: int) -> BenefitRows:
    """Paired rows at step 0 of 2 runs per task; with ``signal`` the embedding's first axis decides
    whether the task needs the frontier."""
    from features.extract import N_FEATURES

    rng = np.random.default_rng(seed)
    n = 2 * n_tasks
    task = np.repeat([f"{domain}/{i}" for i in range(n_tasks)], 2).astype(object)
    hard = np.repeat(rng.random(n_tasks) < 0.5, 2)
    E = rng.normal(size=(n, 384))
    if signal:
        E[:, 0] = np.where(hard, 2.0, -2.0) + 0.3 * rng.normal(size=n)
        y_local = (~hard).astype(float)
    else:
        y_local = (rng.random(n) < 0.5).astype(float)
    E /= np.linalg.norm(E, axis=1, keepdims=True)
    return BenefitRows(
        X=rng.normal(size=(n, N_FEATURES)),
        E=E,
        y_local=y_local,
        y_frontier=np.ones(n),
        run_id=np.array([f"{domain}-r{i}" for i in range(n)], dtype=object),
        task=task,
        domain=np.full(n, domain, dtype=object),
        step=np.zeros(n, dtype=np.int64),
    )


def _concat(a: BenefitRows, b: BenefitRows) -> BenefitRows:
    return BenefitRows(
        *(
            None if getattr(a, f) is None else np.concatenate([getattr(a, f), getattr(b, f)])
            for f in BenefitRows.__dataclass_fields__
        )
    )


def test_a_domain_without_evidence_runs_the_prior():
    rows = _concat(_rows(40, True, "airline", 0), _rows(40, False, "retail", 1))
    rows = _concat(rows, _rows(5, True, "telecom", 2))  # 10 runs < min_runs
    model, rep = fit_benefit(rows, BenefitConfig(min_runs=30, n_boot=50))
    assert rep["airline"]["mode"] == "model" and rep["airline"]["auc"] > 0.75
    assert rep["retail"]["mode"] == "prior" and "does not beat" in rep["retail"]["reason"]
    assert rep["telecom"]["mode"] == "prior" and "min_runs" in rep["telecom"]["reason"]
    x = np.zeros(rows.X.shape[1])
    # the prior answers with the domain's own base rates, whatever the embedding says
    pl, pf, mode, reason = model.predict(x, rows.E[-1], "retail")
    assert mode == "prior" and pl == pytest.approx(model.domains["retail"].p_local) and pf == 1.0
    # the model ranks a hard task above an easy one
    hard = rows.E[(rows.domain == "airline") & (rows.y_local == 0)][0]
    easy = rows.E[(rows.domain == "airline") & (rows.y_local == 1)][0]
    up_hard = np.subtract(*model.predict(x, hard, "airline")[1::-1])
    up_easy = np.subtract(*model.predict(x, easy, "airline")[1::-1])
    assert up_hard > up_easy
    # a domain the bundle never saw: the prior
    assert model.predict(x, hard, "banking")[2:] == ("prior", UNSEEN_REASON)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A real bundle trained on the shipped paired sample (no CV tables: fast)."""
    from models.bundle import ModelBundle
    from training.train import TrainConfig, run_training

    out = tmp_path_factory.mktemp("b")
    cfg = TrainConfig(
        runs=[ROOT / "data" / "paired" / "tau2bench_all.parquet"],
        out=out / "bundle",
        evaluate=False,
        holdout_share=0.0,
        mlflow=False,
        n_estimators=20,
        escalation_n_estimators=20,
    )
    res = run_training(cfg)
    assert res.bundle.benefit is not None
    return ModelBundle.load(out / "bundle"), res


def test_bundle_round_trip_carries_the_benefit_model_and_modes(bundle):
    b, res = bundle
    man = b.manifest["domains"]
    assert set(man) == {"airline", "retail", "telecom"}
    for dom, d in man.items():
        assert d["mode"] in ("model", "prior") and d["reason"]
        assert res.report["benefit"]["domains"][dom]["mode"] == d["mode"]
    emb = np.asarray(
        pd.read_parquet(ROOT / "data" / "paired" / "tau2bench_all.parquet", columns=["task_embedding"])
        .dropna()
        .iloc[0, 0]
    )
    pre = RunPrefix(run_id="r", new_prompt_tokens=2000, domain="telecom", task_embedding=emb)
    p = b.predict(pre)
    assert p.domain_mode == man["telecom"]["mode"] and p.benefit == pytest.approx(
        p.p_success_frontier - p.p_success_local
    )
    # no domain on the run: the escalation classifier alone (old behaviour)
    assert b.predict(RunPrefix(run_id="r", new_prompt_tokens=2000)).benefit is None
    unseen = b.predict(RunPrefix(run_id="r", new_prompt_tokens=2000, domain="banking"))
    assert unseen.domain_mode == "prior" and unseen.domain_reason == UNSEEN_REASON


def test_learned_policy_routes_on_the_benefit_rule():
    from models.types import Predictions
    from router.policy.learned import LearnedPolicy
    from router.policy.types import BackendState, RunState, Snapshot

    pol = LearnedPolicy(p_frontier_up=0.9, p_frontier_down=0.5, value_of_success_usd=1.0)
    backends = [
        BackendState(name="local-0", tier="local", model="qwen", prefill_s_per_token=1e-4),
        BackendState(
            name="frontier",
            tier="frontier",
            model="big",
            price_in_per_m=3.0,
            price_out_per_m=15.0,
            price_cached_in_per_m=0.3,
        ),
    ]

    def decide(pred: Predictions) -> str:
        snap = Snapshot(
            run=RunState(run_id="r"),
            step_index=0,
            features={},
            context_tokens=2000,
            predictions=pred,
            backends=backends,
        )
        return pol.decide(snap).tier

    rem = dict(remaining_tokens_p50=20_000.0)
    # p_frontier is low, but the uplift pays for the frontier: the benefit rule escalates
    assert (
        decide(Predictions(p_frontier=0.1, p_success_local=0.2, p_success_frontier=0.9, benefit=0.7, **rem))
        == "frontier"
    )
    # doomed run: high P(needs frontier) under the old rule, but the frontier fails too (no uplift)
    assert (
        decide(Predictions(p_frontier=0.95, p_success_local=0.1, p_success_frontier=0.1, benefit=0.0, **rem))
        == "local"
    )
    # without the benefit fields the old threshold rule stands
    assert decide(Predictions(p_frontier=0.95, **rem)) == "frontier"


def test_promotion_gate_needs_every_baseline_beaten_by_more_than_its_se():
    from training.promote_gate import baseline_gate, pooled_differences

    def rep(diffs: dict[str, tuple[float, float]]) -> dict:
        return {
            "benefit": {
                "holdout": {
                    "airline": {
                        "n_runs": 30,
                        "learned_minus": {k: {"diff": d, "se": s} for k, (d, s) in diffs.items()},
                    },
                    "retail": {"n_runs": 10, "learned_minus": {k: {"diff": 0.0, "se": 0.0} for k in diffs}},
                }
            }
        }

    # pooled by runs: 0.75 x 0.04 = 0.03 > SE 0.75 x 0.02 = 0.015 for both baselines
    ok, why = baseline_gate(rep({"random_mix": (0.04, 0.02), "per_step_threshold": (0.04, 0.02)}))
    assert ok and "beats every baseline" in why
    assert pooled_differences(rep({"random_mix": (0.04, 0.02)})["benefit"]["holdout"])[
        "random_mix"
    ] == pytest.approx((0.03, 0.015))
    # one baseline within its SE: refused, and the reason names it
    ok, why = baseline_gate(rep({"random_mix": (0.04, 0.02), "per_step_threshold": (0.01, 0.02)}))
    assert not ok and "per_step_threshold" in why and "not > SE" in why
    # no held-out evidence at all: refused
    assert baseline_gate({"benefit": {}}) == (
        False,
        "no held-out labelled tasks: nothing shows the candidate beats the baselines",
    )


def test_domain_mode_metric_says_which_mode_each_domain_runs(bundle):
    from router.server.metrics.registry import RouterMetrics

    b, _ = bundle
    m = RouterMetrics(deprecated_names=False)
    m.set_domains(b.benefit)
    text = m.render()[0].decode()
    for dom, d in b.manifest["domains"].items():
        assert f'runroute_domain_mode{{domain="{dom}",mode="{d["mode"]}"}} 1.0' in text


def test_benefit_report_files(bundle, tmp_path):
    from training.benefit_report import write_benefit_report

    _, res = bundle
    paths = write_benefit_report(res.report["benefit"], tmp_path / "rep")
    names = {p.name for p in paths}
    assert {"benefit.json", "benefit.md", "benefit_auc.png"} <= names
    md = (tmp_path / "rep" / "benefit.md").read_text()
    for dom in ("airline", "retail", "telecom"):
        assert f"| {dom} |" in md
    assert json.loads((tmp_path / "rep" / "benefit.json").read_text())["domains"].keys() == {
        "airline",
        "retail",
        "telecom",
    }
    assert (tmp_path / "rep" / "benefit_auc.png").stat().st_size > 5000


def test_cli_import_domain_roles(tmp_path):
    from typer.testing import CliRunner

    from features.runlog import read_runlog
    from runroute.cli import _typer_app

    src = tmp_path / "in"
    src.mkdir()
    (src / "strong-team__retail_1trial.json").write_text(json.dumps([_sim("1", 1.0), _sim("2", 1.0)]))
    (src / "weak-team__retail_1trial.json").write_text(json.dumps([_sim("1", 1.0), _sim("2", 0.0)]))
    out = tmp_path / "o.parquet"
    r = CliRunner().invoke(_typer_app, ["import", "tau2bench", str(src), "-o", str(out), "--domain-roles"])
    assert r.exit_code == 0, r.output
    runs = read_runlog([str(out)]).runs.set_index("task_id")
    weak = runs[runs["agent"] == "weak-team"]
    assert (
        weak.loc["retail/1", "pair_label"] == "weak_ok"
        and weak.loc["retail/2", "pair_label"] == "needs_frontier"
    )
    bad = CliRunner().invoke(_typer_app, ["import", "mooncake", str(src), "-o", str(out), "--embed"])
    assert bad.exit_code != 0 and "only tau2bench" in str(bad.exception)


def test_sidecar_shows_each_domains_mode_in_get_run_and_metrics(bundle, tmp_path):
    import httpx

    from router.fakes.launch import fake_in_thread
    from router.server.app import create_app, serve_in_thread
    from router.server.settings import RouterSettings

    b, res = bundle
    knobs = dict(model="local-model", base_ms=1.0, prefill_ms_per_token=0.001, decode_ms_per_token=0.2)
    with (
        fake_in_thread("vllm", name="v0", **knobs) as v0,
        fake_in_thread("frontier", model="frontier-model", zero_latency=True) as fr,
    ):
        s = RouterSettings.load(
            None,
            local={"urls": [v0.url], "model": "local-model"},
            frontier={"url": fr.base_url, "model": "frontier-model", "allow_no_key": True},
            policy={"kind": "learned"},
            bundle={"path": str(res.bundle_dir), "watch_s": 0},
            runlog={"dir": str(tmp_path / "logs")},
        )
        with serve_in_thread(create_app(s)) as url:
            body = {"model": "auto", "messages": [{"role": "user", "content": "change my flight"}]}
            hdr = {"X-Run-Id": "r1", "x-runroute-domain": "retail"}
            r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=hdr, timeout=30)
            assert r.status_code == 200, r.text
            run = httpx.get(f"{url}/v1/runs/r1", timeout=30).json()
            want = {k: {"mode": d["mode"], "reason": d["reason"]} for k, d in b.manifest["domains"].items()}
            assert run["domain_modes"] == want
            # the run's own domain: its mode and why, as the step's predictions saw them
            assert run["domain"] == "retail" and run["domain_mode"] == want["retail"]["mode"]
            assert run["domain_reason"] == want["retail"]["reason"]
            preds = run["steps"][0]["predictions"]
            # retail's prior policy is its base rates (no CV here): the step routed on that uplift
            assert preds["benefit"] == pytest.approx(preds["p_success_frontier"] - preds["p_success_local"])
            assert preds["p_success_local"] == pytest.approx(b.benefit.domains["retail"].p_local)
            # a domain the bundle never saw runs the prior and says so
            r = httpx.post(
                f"{url}/v1/chat/completions",
                json=body,
                headers={"X-Run-Id": "r2", "x-runroute-domain": "banking"},
            )
            assert r.status_code == 200
            run2 = httpx.get(f"{url}/v1/runs/r2", timeout=30).json()
            assert run2["domain_mode"] == "prior" and run2["domain_reason"] == UNSEEN_REASON
            metrics = httpx.get(f"{url}/metrics", timeout=30).text
            for dom, d in want.items():
                assert f'runroute_domain_mode{{domain="{dom}",mode="{d["mode"]}"}} 1.0' in metrics


def test_prior_policy_is_the_escalation_classifier_only_where_it_measured_better():
    from training.benefit_job import choose_priors

    rows = _concat(_rows(40, False, "retail", 1), _rows(40, False, "telecom", 3))
    model, _ = fit_benefit(rows, BenefitConfig(min_runs=30, n_boot=50))
    assert model.domains["retail"].mode == model.domains["telecom"].mode == "prior"
    # out-of-fold P(needs frontier): informative in retail (= the run fails), noise in telecom
    rng = np.random.default_rng(5)
    p = np.where(rows.domain == "retail", 1.0 - rows.y_local, rng.random(len(rows)))
    got = choose_priors(model, rows, {"run_id": rows.run_id, "model": p}, BenefitConfig(n_boot=50))
    assert got["retail"]["prior"] == "escalation" and got["retail"]["aiq_gain_over_random_mix"] > 0.05
    assert got["telecom"]["prior"] == "base-rates"
    assert "prior policy: the escalation classifier" in model.domains["retail"].reason
    # the router then routes on P(needs frontier) alone there (no uplift), and on the uplift elsewhere
    assert not model.uses_uplift("retail") and model.uses_uplift("telecom")
    # a domain never trained on runs the global prior: the escalation classifier, like a run without one
    assert not model.uses_uplift("banking") and not model.uses_uplift(None)


def test_a_domain_model_that_does_not_beat_its_prior_policy_is_demoted():
    from training.benefit_job import choose_priors

    rows = _rows(40, True, "airline", 0)
    cfg = BenefitConfig(min_runs=30, n_boot=50)
    model, _ = fit_benefit(rows, cfg)
    assert model.domains["airline"].mode == "model"
    # the escalation classifier knows exactly which runs fail (out of fold): the model cannot beat it
    got = choose_priors(model, rows, {"run_id": rows.run_id, "model": 1.0 - rows.y_local}, cfg)
    assert got["airline"]["prior"] == "escalation" and got["airline"]["mode"] == "prior"
    assert model.domains["airline"].mode == "prior" and "demoted" in model.domains["airline"].reason
    # an uninformative classifier leaves the model active (it beats random mixing by more than its SE)
    model2, _ = fit_benefit(rows, cfg)
    got2 = choose_priors(model2, rows, {"run_id": rows.run_id, "model": np.full(len(rows), 0.5)}, cfg)
    assert got2["airline"]["prior"] == "base-rates" and model2.domains["airline"].mode == "model"
    assert got2["airline"]["model_aiq_gain_over_prior"] > got2["airline"]["model_se"]
