"""Scale benchmark of issue 19: training and a what-if grid, serial vs ``--dask local --workers 2``.

For each size in ``--steps`` (default 1M; 5M and 10M on request) it generates a synthetic run log
with ``runroute generate`` (Parquet; runs = steps / the generator's mean steps per run; above 2M
steps a folder of 2M-step files with seeds 0, 1, ..., so the generator's memory stays bounded), then runs
``runroute train`` serially and with ``--dask local --workers N`` (each a subprocess), and the
what-if grid of 16 points (2 policies x 4 replica counts x 2 KV sizes) both ways. Every command is
timed (wall) and its process tree sampled with psutil every ``--sample-s`` seconds: peak RSS of the
client process and of each Dask worker process (the nanny processes are not counted). The held-out
metrics of the two bundles are compared with :func:`training.agreement.heldout_agreement` (paired
run-clustered bootstrap; the held-out rows rebuilt once, serially). Prints a rich table, writes
``--out``/dask_scale.json and a PNG.

Run:  python bench/dask_scale.py --steps 1000000 --out runroute-report/dask-scale
      python bench/dask_scale.py --steps 1000000,5000000,10000000 --skip-whatif

Knobs: ``--steps``, ``--workers``, ``--whatif-runs`` (runs replayed by the what-if grid),
``--skip-whatif`` / ``--skip-train`` / ``--no-agreement``, ``--modes`` (``dask`` alone for the
largest size), ``--sample-s``, ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
STEPS_PER_RUN = 12.3  # the generator's mean at its defaults (measured on 3000 runs: 36838 steps)


def run_sampled(cmd: list[str], sample_s: float, log: Path) -> dict[str, Any]:
    """Run ``cmd``; wall seconds, exit code and peak RSS (MB) of the client and of each worker."""
    t0 = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
    peaks: dict[int, tuple[str, float]] = {}
    peak_at: dict[int, str] = {}  # wall-clock time of each process's peak (to match the log's phases)
    cpu: dict[int, tuple[str, float]] = {}  # last seen user+system CPU seconds per process
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    rss = p.memory_info().rss / 2**20
                    ct = p.cpu_times()
                    cmdline = " ".join(p.cmdline())
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                role = "client" if p.pid == proc.pid else _role(cmdline)
                if rss > peaks.get(p.pid, ("", 0.0))[1]:
                    peaks[p.pid] = (role, rss)
                    peak_at[p.pid] = time.strftime("%H:%M:%S")
                cpu[p.pid] = (role, ct.user + ct.system)
            done.wait(sample_s)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    rc = proc.wait()
    done.set()
    th.join()
    wall = time.perf_counter() - t0
    workers = sorted((rss for role, rss in peaks.values() if role == "worker"), reverse=True)
    others = sorted((rss for role, rss in peaks.values() if role == "other"), reverse=True)
    return {
        "cmd": " ".join(cmd[2:]),
        "rc": rc,
        "wall_s": round(wall, 1),
        "client_peak_rss_mb": round(max((r for ro, r in peaks.values() if ro == "client"), default=0), 1),
        "worker_peak_rss_mb": [round(r, 1) for r in workers],
        "other_peak_rss_mb": [round(r, 1) for r in others[:4]],
        "peak_at": {
            f"{peaks[k][0]}-{k}": [round(peaks[k][1]), peak_at[k]] for k in peaks if peaks[k][1] > 500
        },
        "cpu_s_by_role": {
            role: round(sum(c for ro, c in cpu.values() if ro == role), 1)
            for role in {r for r, _ in cpu.values()}
        },
        "load_avg_1m_end": round(os.getloadavg()[0], 2),
    }


def _role(cmdline: str) -> str:
    """A LocalCluster's worker processes run multiprocessing's spawn main; a nanny is its parent."""
    if "multiprocessing.spawn" in cmdline or "spawn_main" in cmdline:
        return "worker"
    if "multiprocessing.resource_tracker" in cmdline or "forkserver" in cmdline:
        return "tracker"
    return "other"  # e.g. loky workers of the serial fits


def cli(*args: str) -> list[str]:
    return [PY, "-m", "runroute", *args]


CHUNK_STEPS = 2_000_000  # steps per generated file: the generator holds ~2.7 GB per 1M steps


def generate(steps: int, data: Path) -> Path:
    """A synthetic log of ``steps`` steps: one file (seed 0) up to :data:`CHUNK_STEPS`, else a
    folder of files of at most that many steps each (seeds 0, 1, ...; run ids ``gen<seed>-<i>`` never
    collide), which ``runroute train --runs`` reads as one log; the generator's memory stays that of
    one chunk."""
    runs = max(1, int(round(steps / STEPS_PER_RUN)))
    if steps <= CHUNK_STEPS:
        out = data / f"steps-{steps}.parquet"
        parts = [(out, runs, 0)]
    else:
        out = data / f"steps-{steps}"
        k = -(-steps // CHUNK_STEPS)
        parts = [(out / f"part-{i:03d}.parquet", runs // k + (i < runs % k), i) for i in range(k)]
    for path, n_runs, seed in parts:
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(
            cli("generate", "-o", str(path), "--runs", str(n_runs), "--seed", str(seed)),
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if r.returncode:
            raise SystemExit(r.stderr)
    return out


def train_case(
    log: Path,
    out: Path,
    workers: int,
    sample_s: float,
    agreement: bool,
    modes: tuple[str, ...],
    prev: dict[str, Any] | None = None,
) -> dict[str, Any]:
    # a mode not run now keeps an earlier invocation's figures (and bundle) for this size
    res: dict[str, Any] = {
        m: v for m, v in (prev or {}).items() if m in ("serial", "dask") and m not in modes
    }
    for mode in modes:
        extra = ["--dask", "local", "--workers", str(workers)] if mode == "dask" else []
        rep = out / f"{log.stem}-{mode}.json"
        cmd = cli(
            "train",
            "--runs",
            str(log),
            "-o",
            str(out / f"{log.stem}-{mode}"),
            "--no-mlflow",
            "--no-eval",
            "--report-json",
            str(rep),
            *extra,
        )
        r = run_sampled(cmd, sample_s, out / f"{log.stem}-{mode}.log")
        if r["rc"] == 0:
            report = json.loads(rep.read_text())
            r["n_steps"] = report["n_steps"]
            r["holdout"] = report.get("holdout", {})
            r["timings"] = report.get("timings", {})
            th = report.get("thresholds", {})
            r["frontier_share"] = {  # of runs: the target, where set, held-out (same in both modes)
                k: th.get(f"{k}_frontier_share") for k in ("target", "expected", "holdout")
            }
            # where the thresholds were set (the calibration slice above calibration_max_rows) and
            # what the out-of-fold rule would have escalated there: the folds' bias, if any
            r["threshold_source"] = th.get("source", "out-of-fold")
            r["slice_share_at_oof_up"] = th.get("slice_share_at_oof_up")
            r["oof_expected_frontier_share"] = th.get("oof_expected_frontier_share")
            if "dask" in report:  # each worker's peak RSS (MB) as each stage ended: which stage set it
                r["worker_peak_by_stage_mb"] = report["dask"].get("worker_peak_rss_mb", {})
        res[mode] = r
    if agreement and all(res.get(m, {}).get("rc") == 0 for m in ("serial", "dask")):
        from models.bundle import ModelBundle
        from training.agreement import heldout_agreement
        from training.dataset import build_dataset
        from training.train import holdout_mask, load_runs

        ds = build_dataset(load_runs([log], []))
        held = ds.subset(holdout_mask(ds.meta["group"].to_numpy(dtype=object), 0.2))
        a, b = ModelBundle.load(out / f"{log.stem}-serial"), ModelBundle.load(out / f"{log.stem}-dask")
        res["agreement"] = heldout_agreement(a, b, held, n_boot=100)
    return res


def whatif_case(log: Path, out: Path, runs: int, workers: int, sample_s: float) -> dict[str, Any]:
    grid = [
        "whatif",
        "--runs",
        str(log),
        "--limit-runs",
        str(runs),
        "--replicas",
        "1,2,4,8",
        "--kv-cache-gb",
        "8,16",
        "--no-kv-double",
        "--policy",
        "always-local,session-sticky",
        "--seed",
        "0",
    ]
    res: dict[str, Any] = {}
    for mode in ("serial", "dask"):
        extra = ["--dask", "local", "--workers", str(workers)] if mode == "dask" else []
        j = out / f"whatif-{mode}.json"
        r = run_sampled(cli(*grid, "--json", str(j), *extra), sample_s, out / f"whatif-{mode}.log")
        if r["rc"] == 0:
            doc = json.loads(j.read_text())
            r["points"] = len(doc["scorecards"])
            r["sum_point_wall_s"] = round(sum(d["sim_wall_s"] for d in doc["details"]), 1)
        res[mode] = r
    a, b = (json.loads((out / f"whatif-{m}.json").read_text()) for m in ("serial", "dask"))
    res["scorecards_identical"] = json.dumps(a["scorecards"]) == json.dumps(b["scorecards"])
    res["speedup"] = round(res["serial"]["wall_s"] / res["dask"]["wall_s"], 2)
    return res


def render(doc: dict[str, Any], png: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"runroute on Dask: serial vs --dask local --workers {doc['workers']}")
    for c in ("case", "mode", "wall s", "client peak MB", "worker peak MB", "metric (serial / dask, SE)"):
        t.add_column(c)
    for size, res in doc["train"].items():
        ag = res.get("agreement", {})
        note = "; ".join(
            f"{k} {v['a']:.4g}/{v['b']:.4g} (SE {v['se']:.2g}{'' if v['agree'] else ' DISAGREE'})"
            for k, v in ag.items()
        )
        for mode in ("serial", "dask"):
            if mode not in res:
                t.add_row(f"train {size}", mode, "not run", "", "", "")
                continue
            r = res[mode]
            wk = ", ".join(f"{x:.0f}" for x in r["worker_peak_rss_mb"]) or "-"
            t.add_row(
                f"train {size}",
                mode,
                f"{r['wall_s']:.1f}" + ("" if r["rc"] == 0 else " FAILED"),
                f"{r['client_peak_rss_mb']:.0f}",
                wk,
                note if mode == "dask" else "",
            )
    if "whatif" in doc:
        w = doc["whatif"]
        for mode in ("serial", "dask"):
            r = w[mode]
            wk = ", ".join(f"{x:.0f}" for x in r["worker_peak_rss_mb"]) or "-"
            extra = f"speedup {w['speedup']}x; scorecards identical: {w['scorecards_identical']}"
            t.add_row(
                f"what-if {r.get('points', '?')} points",
                mode,
                f"{r['wall_s']:.1f}",
                f"{r['client_peak_rss_mb']:.0f}",
                wk,
                extra if mode == "dask" else "",
            )
    con = Console(width=200)
    con.print(t)
    for size, res in doc["train"].items():  # which stage set each worker's peak, and the share
        for mode in ("serial", "dask"):
            r = res.get(mode, {})
            if "frontier_share" in r:
                fs = " / ".join("-" if v is None else f"{100 * v:.1f}%" for v in r["frontier_share"].values())
                src = r.get("threshold_source", "out-of-fold")
                con.print(f"train {size} {mode}: frontier share of runs target / {src} / held-out {fs}")
                if r.get("slice_share_at_oof_up") is not None:
                    con.print(
                        f"  {mode} out-of-fold threshold: {100 * r['oof_expected_frontier_share']:.1f}% of the "
                        f"out-of-fold runs, {100 * r['slice_share_at_oof_up']:.1f}% of the slice's runs "
                        "under the final model"
                    )
            for stage, mb in r.get("worker_peak_by_stage_mb", {}).items():
                con.print(f"  {mode} worker peak RSS after {stage}: {', '.join(f'{x:.0f}' for x in mb)} MB")
    _plot(doc, png)


def _plot(doc: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [(f"train {s}", r) for s, r in doc["train"].items()]
    if "whatif" in doc:
        cases.append(("what-if 16 pts", doc["whatif"]))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    xs = range(len(cases))
    for k, (mode, off) in enumerate((("serial", -0.2), ("dask", 0.2))):
        wall = [c[mode]["wall_s"] if mode in c else 0.0 for _, c in cases]
        ax1.bar([x + off for x in xs], wall, 0.4, label=mode, color=f"C{k}")
        mem = [
            max([c[mode]["client_peak_rss_mb"], *c[mode]["worker_peak_rss_mb"]]) / 1024 if mode in c else 0.0
            for _, c in cases
        ]
        ax2.bar([x + off for x in xs], mem, 0.4, label=mode, color=f"C{k}")
    for ax, lab in ((ax1, "wall time (s)"), (ax2, "peak RSS of one process (GB)")):
        ax.set_xticks(list(xs), [n for n, _ in cases])
        ax.set_ylabel(lab)
        ax.legend()
    ax2.axhline(8, color="red", ls="--", lw=1)
    fig.suptitle(f"serial vs --dask local --workers {doc['workers']} (2-core shared machine)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="1000000")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--whatif-runs", type=int, default=3000)
    ap.add_argument("--skip-whatif", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--no-agreement", action="store_true")
    ap.add_argument("--modes", default="serial,dask", help="training modes to run (e.g. dask alone at 10M)")
    ap.add_argument("--sample-s", type=float, default=0.5)
    ap.add_argument("--data", type=Path, default=Path("/tmp/runroute-dask-scale"))
    ap.add_argument("--out", type=Path, default=ROOT / "runroute-report" / "dask-scale")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    a.data.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"workers": a.workers, "cpus": os.cpu_count(), "train": {}}
    old = a.out / "dask_scale.json"
    if old.exists():  # keep the cases measured by an earlier invocation
        prev = json.loads(old.read_text())
        doc["train"].update(prev.get("train", {}))
        if "whatif" in prev:
            doc["whatif"] = prev["whatif"]
    sizes = [int(float(s)) for s in a.steps.split(",") if s]
    if not a.skip_whatif:  # its own log of --whatif-runs runs (reading a 1M-step log would dominate)
        log = generate(int(a.whatif_runs * STEPS_PER_RUN), a.data)
        doc["whatif"] = whatif_case(log, a.out, a.whatif_runs, a.workers, a.sample_s)
    if not a.skip_train:
        for n in sizes:
            log = generate(n, a.data)
            key = f"{n / 1e6:g}M"
            doc["train"][key] = train_case(
                log,
                a.out,
                a.workers,
                a.sample_s,
                not a.no_agreement,
                tuple(a.modes.split(",")),
                doc["train"].get(key),
            )
            old.write_text(json.dumps(doc, indent=2) + "\n")
    old.write_text(json.dumps(doc, indent=2) + "\n")
    render(doc, a.out / "dask_scale.png")
    print(f"wrote {old} and {a.out / 'dask_scale.png'}")


if __name__ == "__main__":
    main()
