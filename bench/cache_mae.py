"""Cache-reuse MAE on a held-out real trace: the last share of the Mooncake conversation hour.

Usage::

    .venv/bin/python bench/cache_mae.py [--data ../shared/data] [--bundle DIR] [--out runroute-report]
                                        [--holdout-share 0.2] [--json]

Algorithm:

1. Import the whole Mooncake conversation trace (``features.importers.mooncake``: requests chained
   into runs by shared leading blocks). The held-out steps are those arriving in the last
   ``--holdout-share`` of the trace's time span (default 20%: minutes ~47-59 of the hour). The
   shipped sample the demo trains on is the first 20 minutes, so the two never overlap; nothing here
   is fitted or chosen on the held-out steps.
2. Labels and features of the whole trace through training's own code path
   (:func:`training.dataset.build_dataset`) with the deployment's cache: the demo's simulated
   deployment (``DemoConfig().sim``: node profile, KV GB per replica, replicas), i.e. the same
   :func:`training.dataset.node_cache_blocks` the demo bundle's labels used. The whole trace is
   replayed (a warm cache at the cut), then the held-out rows are selected. "Actual" = the replayed
   cached tokens (the trace logs no ``cached_tokens``; the replay is the simulator's node model).
3. The bundle: ``--bundle DIR`` (e.g. ``runroute-report/bundle`` after ``make demo``), else it is
   trained here exactly as ``make demo`` trains it (the demo's split of the shipped samples and
   :func:`runroute.demo._train`, without MLflow).
4. MAE in tokens per held-out step of: the bundle's cache-reuse model; predicting 0; the logged
   prefix-reuse bound (predicting the whole reusable prefix: ``prefix_reuse_tokens``, the leading
   blocks of the prompt seen in any earlier request, i.e. an infinite cache); plus the hit share
   (sum of cached or predicted tokens / sum of prompt tokens) predicted vs actual. A rich table,
   ``<out>/cache_mae.json`` and ``<out>/cache_mae.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def demo_config(work: Path, kv_cache_gb: float | None = None) -> Any:
    """The demo's config (MLflow off), its simulated deployment's KV GB per replica overridden."""
    from runroute.demo import DemoConfig

    cfg = DemoConfig(out=work, mlflow=False)
    if kv_cache_gb is not None:
        cfg = cfg.model_copy(update={"sim": cfg.sim.model_copy(update={"kv_cache_gb": kv_cache_gb})})
    return cfg


def heldout_rows(log: Any, share: float, sim: Any) -> tuple[Any, np.ndarray, float]:
    """The dataset of the whole trace (deployment cache) and the mask of held-out rows by time."""
    from training.dataset import build_dataset

    ds = build_dataset(log, replicas=sim.replicas, node_gpu=sim.gpu, kv_cache_gb=sim.kv_cache_gb)
    st = log.steps.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
    arrival = st["arrival_s"].to_numpy(dtype=np.float64)
    t0, t1 = float(np.nanmin(arrival)), float(np.nanmax(arrival))
    cut = t1 - share * (t1 - t0)
    if not (st["run_id"].astype(str).to_numpy() == ds.meta["run_id"].to_numpy()).all():
        raise RuntimeError("dataset rows are not in (run_id, step) order")
    ds.meta["prefix_reuse_tokens"] = st["prefix_reuse_tokens"].to_numpy(dtype=np.float64)
    ds.meta["prompt_tokens"] = st["prompt_tokens"].to_numpy(dtype=np.float64)
    return ds, arrival >= cut, cut


def demo_bundle(cfg: Any, say: Any) -> Any:
    """Train the bundle as ``make demo`` does (its split and training config, MLflow off)."""
    from features.runlog import read_runlog
    from features.samples import samples_dir
    from runroute.demo import _train
    from training.eval.split import split_by_task

    work = Path(cfg.out)
    files = sorted(samples_dir().glob("*.parquet"))
    log = read_runlog([str(f) for f in files])
    split_by_task(
        log.runs,
        log.steps,
        data_dir=work / "data",
        holdout_share=cfg.tau2_holdout_share,
        seed=cfg.seed,
        synthetic_train_runs=cfg.synthetic_train_runs,
        synthetic_train_seed=cfg.synthetic_train_seed,
        synthetic_holdout_runs=cfg.synthetic_holdout_runs,
        synthetic_holdout_seed=cfg.synthetic_holdout_seed,
    )
    _, tres = _train(cfg, work, work / "data" / "train.parquet", say)
    return tres.bundle, tres.report.get("sources", {})


def figures(y: np.ndarray, prompt: np.ndarray, preds: dict[str, np.ndarray]) -> dict[str, Any]:
    tot = float(prompt.sum())
    out: dict[str, Any] = {
        "n_steps": int(len(y)),
        "actual_hit_share": float(y.sum() / tot),
        "actual_mean_tokens": float(y.mean()),
    }
    for k, p in preds.items():
        err = np.abs(p - y)
        se = float(err.std(ddof=1) / np.sqrt(len(err)))
        out[k] = {"mae_tokens": float(err.mean()), "se": se, "hit_share": float(p.sum() / tot)}
    return out


def plot(res: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in ("bundle", "predict_0", "prefix_bound") if k in res]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    mae = [res[k]["mae_tokens"] for k in names]
    a.bar(names, mae, yerr=[2 * res[k]["se"] for k in names], color=["C0", "C7", "C3"][: len(names)])
    a.set_ylabel("MAE (tokens per step)")
    a.set_title(f"cache reuse, held-out Mooncake ({res['n_steps']} steps)")
    share = [res[k]["hit_share"] for k in names]
    b.bar(
        ["actual", *names], [res["actual_hit_share"], *share], color=["k", "C0", "C7", "C3"][: len(names) + 1]
    )
    b.set_ylabel("hit share (cached / prompt tokens)")
    b.set_ylim(0, 1)
    b.set_title("hit share: predicted vs actual")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--bundle", type=Path, default=None, help="a bundle dir (default: train as make demo)")
    ap.add_argument("--out", type=Path, default=Path("runroute-report"))
    ap.add_argument("--holdout-share", type=float, default=0.2)
    ap.add_argument(
        "--kv-cache-gb",
        type=float,
        default=None,
        help="sensitivity: KV GB per replica of the deployment (labels of training AND held-out; default the demo's)",
    )
    ap.add_argument("--json", action="store_true", help="print the JSON figures")
    a = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    from features.importers.mooncake import import_mooncake
    from features.runlog import RunLog
    from models.bundle import ModelBundle

    con = Console(width=None if Console().is_terminal else 140)
    t = time.perf_counter()
    with con.status("importing the Mooncake conversation trace"):
        log = RunLog.from_frame(import_mooncake(a.data / "mooncake" / "conversation_trace.jsonl"))
    with con.status("replaying the trace through the deployment's cache"):
        sim = demo_config(a.out, a.kv_cache_gb).sim
        ds, hold, cut = heldout_rows(log, a.holdout_share, sim)
    sources: dict[str, int] = {}
    if a.bundle is not None:
        bundle = ModelBundle.load(a.bundle)
    else:
        with tempfile.TemporaryDirectory() as d, con.status("training the bundle as make demo does") as s:
            cfg = demo_config(Path(d), a.kv_cache_gb)
            bundle, sources = demo_bundle(cfg, lambda m: s.update(f"training: {m}"))
    if bundle.cache_reuse is None:
        raise SystemExit("the bundle has no cache-reuse model")
    X, m = ds.X[hold], ds.meta[hold]
    y = m["y_cache"].to_numpy(dtype=np.float64)
    prompt = m["prompt_tokens"].to_numpy(dtype=np.float64)
    preds = {
        "bundle": np.asarray(bundle.cache_reuse.predict(X), dtype=np.float64),
        "predict_0": np.zeros(len(y)),
        "prefix_bound": m["prefix_reuse_tokens"].to_numpy(dtype=np.float64),
    }
    res = figures(y, prompt, preds)
    res.update(
        cut_s=cut,
        holdout_share=a.holdout_share,
        deployment={"gpu": sim.gpu, "kv_cache_gb": sim.kv_cache_gb, "replicas": sim.replicas},
        bundle_version=bundle.version,
        training_steps_by_source=sources,
        beats_both=bool(
            res["bundle"]["mae_tokens"]
            < min(res["predict_0"]["mae_tokens"], res["prefix_bound"]["mae_tokens"])
        ),
        seconds=round(time.perf_counter() - t, 1),
    )
    tab = Table(
        title=f"cache-reuse MAE, Mooncake conversation trace, steps arriving after {cut:.0f} s; deployment "
        f"{sim.replicas} x {sim.gpu} {sim.kv_cache_gb:g} GB KV"
    )
    for c in ("predictor", "MAE tokens", "± SE", "hit share"):
        tab.add_column(c, justify="left" if c == "predictor" else "right")
    tab.add_row("actual (replayed deployment cache)", "", "", f"{res['actual_hit_share']:.3f}")
    for k, label in (
        ("bundle", "bundle (as make demo trains it)"),
        ("predict_0", "predict 0"),
        ("prefix_bound", "prefix-reuse bound (infinite cache)"),
    ):
        r = res[k]
        tab.add_row(label, f"{r['mae_tokens']:,.0f}", f"{r['se']:,.0f}", f"{r['hit_share']:.3f}")
    con.print(tab)
    con.print(f"{res['n_steps']} held-out steps; bundle beats both baselines: {res['beats_both']}")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "cache_mae.json").write_text(json.dumps(res, indent=2) + "\n")
    plot(res, a.out / "cache_mae.png")
    con.print(f"wrote {a.out / 'cache_mae.json'} and {a.out / 'cache_mae.png'} ({res['seconds']} s)")
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
