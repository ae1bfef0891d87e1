"""Run-start arrival processes for the what-if simulator.

Each process returns one start time (seconds, first at 0) per run, in the order of the runs given:

- ``trace``: the runs' own logged start times (``started_at``, else the first step's ``arrival_s``).
- ``azure-code``: the request arrival times of the Azure LLM inference 2023 *code* trace (bursty),
  one run start per request, cycled (shifted by the trace's span) when there are more runs than
  requests. Loaded from the shipped sample ``data/azure_2023.parquet`` (arrival records with source
  ``azure-code``) if present, else from ``<shared>/azure_llm_2023/AzureLLMInferenceTrace_code.csv``.
- ``servegen:<category>`` (e.g. ``servegen:m-large``): the per-10-minute request rate summed over the
  category's clients, divided by the workload's mean steps per run (so the *step* rate follows the
  trace), as a piecewise-constant Poisson process; windows are cycled. From
  ``data/servegen_<category>.parquet`` (rate records) if present, else
  ``<shared>/servegen/language/<category>/chunk-*-trace.csv``. The windows' burstiness (cv) is not
  reproduced: within a window arrivals are Poisson.
- ``rate=R``: a Poisson process of ``R`` run starts per second.

``speedup`` divides every time (a trace replayed ``speedup`` times faster; ``rate=R`` at speedup 2 is
``2R``). All randomness comes from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np

__all__ = ["ArrivalError", "run_starts", "SHARED_DIR"]

SHARED_DIR = Path("/work/shared/data")


class ArrivalError(ValueError):
    """A bad arrival spec or missing arrival data (one line)."""


def _samples(data_dir: Path | None) -> Path:
    """``data_dir``, else the shipped samples (a checkout or an installed package)."""
    if data_dir is not None:
        return data_dir
    from features.samples import samples_dir

    return samples_dir()


def _azure_code_times(data_dir: Path | None, shared_dir: Path) -> np.ndarray:
    sample = _samples(data_dir) / "azure_2023.parquet"
    if sample.exists():
        from features.runlog import read_runlog

        arr = read_runlog(sample).arrivals
        arr = arr[arr["source"] == "azure-code"]
        if len(arr):
            return np.sort(arr["arrival_s"].to_numpy(float))
    csv = shared_dir / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
    if not csv.exists():
        raise ArrivalError(f"azure-code arrivals: neither {sample} nor {csv} found")
    import pandas as pd

    ts = pd.to_datetime(pd.read_csv(csv, usecols=["TIMESTAMP"])["TIMESTAMP"])
    s = (ts - ts.min()).dt.total_seconds().to_numpy(float)
    return np.sort(s)


def _servegen_rates(
    category: str, data_dir: Path | None, shared_dir: Path
) -> tuple[np.ndarray, np.ndarray, float]:
    """(window starts, aggregate req/s, window length) for a ServeGen language category."""
    import pandas as pd

    sample = _samples(data_dir) / f"servegen_{category.replace('-', '_')}.parquet"
    if sample.exists():
        from features.runlog import read_runlog

        rates = read_runlog(sample).rates
        if len(rates):
            agg = rates.groupby("start_s")["rate"].sum().sort_index()
            return agg.index.to_numpy(float), agg.to_numpy(float), float(rates["duration_s"].iloc[0])
    files = sorted(glob.glob(str(shared_dir / "servegen" / "language" / category / "chunk-*-trace.csv")))
    if not files:
        raise ArrivalError(
            f"servegen:{category}: neither {sample} nor ServeGen CSVs under {shared_dir} found"
        )
    df = pd.concat([pd.read_csv(f, header=None, usecols=[0, 1], names=["start_s", "rate"]) for f in files])
    agg = df.groupby("start_s")["rate"].sum().sort_index()
    starts = agg.index.to_numpy(float)
    dur = float(np.median(np.diff(starts))) if len(starts) > 1 else 600.0
    return starts, agg.to_numpy(float), dur


def _piecewise_poisson(
    starts: np.ndarray, rates: np.ndarray, dur: float, n: int, rng: np.random.Generator
) -> np.ndarray:
    if not np.any(rates > 0):
        raise ArrivalError("servegen: every window has rate 0")
    out: list[np.ndarray] = []
    got = 0
    span = float(starts[-1] - starts[0] + dur)
    cycle = 0
    while got < n:
        for s0, r in zip(starts, rates, strict=True):
            if r <= 0:
                continue
            k = int(rng.poisson(r * dur))
            if k:
                out.append(np.sort(rng.uniform(0, dur, k)) + (s0 - starts[0]) + cycle * span)
                got += k
                if got >= n:
                    break
        cycle += 1
    return np.concatenate(out)[:n]


def run_starts(
    spec: str,
    n_runs: int,
    *,
    logged_starts: np.ndarray | None = None,
    seed: int = 0,
    speedup: float = 1.0,
    mean_steps_per_run: float = 1.0,
    data_dir: Path | None = None,
    shared_dir: Path = SHARED_DIR,
) -> np.ndarray:
    """Start time of each of ``n_runs`` runs (float64 seconds, min 0) under arrival process ``spec``."""
    if speedup <= 0:
        raise ArrivalError(f"--speedup must be > 0 (got {speedup})")
    if n_runs == 0:
        return np.zeros(0)
    rng = np.random.default_rng(seed)
    if spec == "trace":
        if logged_starts is None or len(logged_starts) != n_runs or np.isnan(logged_starts).any():
            raise ArrivalError(
                "--arrivals trace: some runs have no logged start time (started_at / arrival_s)"
            )
        t = np.asarray(logged_starts, float)
        return (t - t.min()) / speedup
    if spec.startswith("rate="):
        try:
            rate = float(spec[5:])
        except ValueError:
            raise ArrivalError(f"--arrivals {spec}: rate is not a number") from None
        if rate <= 0:
            raise ArrivalError(f"--arrivals {spec}: rate must be > 0")
        gaps = rng.exponential(1.0 / rate, n_runs)
        gaps[0] = 0.0
        t = np.cumsum(gaps)
    elif spec == "azure-code":
        base = _azure_code_times(data_dir, shared_dir)
        base = base - base[0]
        span = float(base[-1]) + float(np.median(np.diff(base))) if len(base) > 1 else 1.0
        reps = -(-n_runs // len(base))
        t = np.concatenate([base + i * span for i in range(reps)])[:n_runs]
    elif spec.startswith("servegen:"):
        cat = spec.split(":", 1)[1]
        if not cat or "/" in cat or ".." in cat:
            raise ArrivalError(f"--arrivals {spec}: bad ServeGen category")
        starts, rates, dur = _servegen_rates(cat, data_dir, shared_dir)
        rates = rates / max(mean_steps_per_run, 1e-9)
        t = _piecewise_poisson(starts, rates, dur, n_runs, rng)
        t = t - t[0]
    else:
        raise ArrivalError(
            f"unknown arrival process '{spec}' (use trace, azure-code, servegen:<category> or rate=R)"
        )
    t = np.sort(t) / speedup
    if logged_starts is not None and len(logged_starts) == n_runs and not np.isnan(logged_starts).any():
        # keep the logged order of runs: the i-th earliest logged run gets the i-th start
        out = np.empty(n_runs)
        out[np.argsort(np.asarray(logged_starts, float), kind="stable")] = t
        return out
    return t
