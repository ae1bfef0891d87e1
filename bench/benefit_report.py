"""The benefit model's figures on the shipped paired sample: train, gate, tables, timing.

Usage (from the repository root)::

    .venv/bin/python bench/benefit_report.py [--out runroute-report/benefit] [--runs FILE ...]

Runs the training job (:func:`training.train.run_training`, MLflow off) on
``data/paired/tau2bench_all.parquet`` (every tau2 file, three domains, per-run labels, task
embeddings) with 20% of the tasks held out by a stable hash, and writes the benefit report
(``benefit.json``, ``benefit.md``, ``benefit_auc.png``, ``benefit_learning_curve.png``) and the
training report (``train_report.json``) into ``--out``. Prints the per-domain table, the safety
checks and the wall time of the whole retraining (the < 2 minutes on 2 cores figure).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from training.benefit_report import benefit_markdown
    from training.train import TrainConfig, run_training

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runroute-report/benefit"))
    ap.add_argument("--runs", type=Path, action="append", default=[])
    ap.add_argument("--holdout-share", type=float, default=0.2)
    args = ap.parse_args()
    runs = args.runs or [ROOT / "data" / "paired" / "tau2bench_all.parquet"]
    cfg = TrainConfig(
        runs=runs,
        out=args.out / "bundle",
        report_json=args.out / "train_report.json",
        benefit_report_dir=args.out,
        holdout_share=args.holdout_share,
        mlflow=False,
    )
    t0 = time.perf_counter()
    res = run_training(cfg, progress=lambda m: print(f"[{time.perf_counter() - t0:6.1f}s] {m}", flush=True))
    wall = time.perf_counter() - t0
    print(benefit_markdown(res.report["benefit"]))
    print(f"retraining wall time: {wall:.1f} s (timings: {res.report['timings']})")
    print(f"report: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
