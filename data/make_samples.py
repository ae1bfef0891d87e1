"""Regenerate the shipped run-log samples in data/ from the full traces in ../shared/data.

Usage (from the repository root): ``.venv/bin/python data/make_samples.py [--shared ../shared/data]``

Each sample is made with the importers in features/importers/ (the same code `runroute import` runs),
cut as described in data/README.md, written with features.runlog.write_frame, read back with strict
validation, and summarised. Deterministic: the same inputs give byte-identical figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent  # data/: the samples are written beside this script
sys.path.insert(0, str(HERE.parent))  # the repository root, when run as a script

import pandas as pd  # noqa: E402

from features.importers.azure import import_azure  # noqa: E402
from features.importers.mooncake import import_mooncake  # noqa: E402
from features.importers.pairing import label_domain_runs, label_weak_runs  # noqa: E402
from features.importers.servegen import import_servegen  # noqa: E402
from features.importers.summary import print_summary  # noqa: E402
from features.importers.swebench_pro import import_swebench_pro  # noqa: E402
from features.importers.tau2bench import import_tau2bench  # noqa: E402
from features.importers.taubench import import_taubench  # noqa: E402
from features.runlog import read_records, write_frame  # noqa: E402

MOONCAKE_UNTIL_S = 1200.0  # first 20 minutes
SERVEGEN_CLIENTS = 12  # busiest clients by mean rate
SERVEGEN_DAYS = 3
TAU2_WEAK, TAU2_STRONG = "gpt-oss-120b", "claude-sonnet-4-5"
# the six airline submissions the airline sample has always held (later files go to tau2bench_all)
TAU2_AIRLINE_SUBMISSIONS = (
    "button-claude-opus-4-6_distyl-ai_2026-03-04",
    "claude-sonnet-4-5_aide-platform_2025-10-31",
    "gpt-oss-120b_openai_2025-11-26",
    "ironshell-ironforge_ironshell-ui_2026-03-09",
    "toolorchestra_nvidia_2025-12-02",
)
SWE_WEAK, SWE_STRONG = "gpt-4o-paper", "claude-45sonnet-10132025"


def build(shared: Path) -> dict[str, pd.DataFrame]:
    samples: dict[str, pd.DataFrame] = {}
    samples["taubench_airline.parquet"] = import_taubench(
        shared / "taubench/gpt-4o-airline.json", strict=True
    )
    airline = sorted(
        f
        for f in (shared / "tau2bench").glob("*.json")
        if "airline" in f.name and f.name.split("__", 1)[0] in TAU2_AIRLINE_SUBMISSIONS
    )
    tau2 = pd.concat([import_tau2bench(f, strict=True) for f in airline], ignore_index=True)
    samples["tau2bench_airline.parquet"] = label_weak_runs(tau2, TAU2_WEAK, TAU2_STRONG)
    # in paired/ (not matched by data/*.parquet, which the demo reads whole: its runs are the same
    # simulations as tau2bench_airline's): every tau2 file, every domain, per-domain roles, per-run labels, task embeddings (C1);
    # the one simulation without a reward (a cascata airline run) is reported and left out
    bad: list[object] = []
    everything = import_tau2bench(shared / "tau2bench", bad_rows=bad, embed=True)  # type: ignore[arg-type]
    for b in bad:
        print(f"tau2bench_all: left out {b}")
    samples["paired/tau2bench_all.parquet"] = label_domain_runs(everything)
    swe = import_swebench_pro(shared / "swebench_pro", strict=True)
    samples["swebench_pro.parquet"] = label_weak_runs(swe, SWE_WEAK, SWE_STRONG)
    samples["mooncake_20min.parquet"] = import_mooncake(
        shared / "mooncake/conversation_trace.jsonl", strict=True, until_s=MOONCAKE_UNTIL_S
    )
    samples["azure_2023.parquet"] = import_azure(shared / "azure_llm_2023", strict=True)
    sg = import_servegen(shared / "servegen/language/m-large", strict=True)
    busiest = sg.groupby("client")["rate"].mean().sort_values(ascending=False).head(SERVEGEN_CLIENTS).index
    sg = sg[sg["client"].isin(busiest) & (sg["start_s"] < SERVEGEN_DAYS * 86400)].reset_index(drop=True)
    samples["servegen_m_large.parquet"] = sg
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=HERE.parent.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=HERE)
    ap.add_argument("--only", action="append", default=[], help="write only this sample (repeat)")
    args = ap.parse_args()
    for name, df in build(args.shared).items():
        if args.only and name not in args.only:
            continue
        path = write_frame(df, args.out / name)
        back = read_records(path, strict=True, quarantine=False).frame
        assert len(back) == len(df), f"{name}: {len(back)} rows read back, {len(df)} written"
        print(f"{name}: {len(df):,} records, {path.stat().st_size / 1e3:,.0f} kB")
        print_summary(back, title=name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
