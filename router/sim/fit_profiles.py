"""Fit the local-node step-time model to the measured GPU tables and write ``profiles/*.json``.

The simulated node prices one continuous-batching iteration as::

    t = a + b * sum(prefill tokens) + c * sum(l * (s + l)) + d * sum(decode context) + e * batch

(``l`` = a prefill chunk's length, ``s`` = tokens of that request already in KV; with no cache and no
chunking ``l * (s + l)`` is ``len^2``.)

Algorithm:

1. **Splitwise** (``splitwise_perf_model.csv``, llama2-70b on DGX A100/H100 at TP 2/4/8): median per
   (hardware, TP, prompt_size, batch_size, token_size). A *prompt row* is a prefill of ``batch`` prompts
   of ``P`` tokens: features ``[1, B*P, B*P^2, 0, B]`` against ``prompt_time``. A *token row* is one
   decode iteration of ``B`` sequences whose mean context is ``P + T/2``: ``[1, 0, 0, B*(P+T/2), B]``
   against ``token_time``. A non-negative least-squares fit on *relative* error (each row divided by
   its target) gives ``a..e``; the fit error is the mean/max absolute percentage error per row kind.
2. **Consistency check before fitting**: prompt time grows ~linearly in batch in these tables, so a row
   whose prompt time at batch 64 is not 1.5-2.6x the batch-32 time of the same configuration is dropped
   (and listed in the provenance). This removes the inconsistent batch-64 rows (e.g. A100 TP2: 794 ms
   at batch 64 vs 6,633 ms at batch 32).
3. **Vidur** (``vidur/*_mlp.csv``, non-attention operators of Llama-3-8B on A100 / Llama-2-7B on H100,
   per layer, TP1): the per-iteration time ``emb + n_layers * sum(layer ops)`` is fitted linearly in
   ``num_tokens`` -> ``a``, ``b`` of a single-GPU 8B/7B node. Vidur has no attention tables here, so
   ``c``, ``d``, ``e`` are *transferred* from the same GPU's llama2-70b TP2 fit, scaled by the model
   shapes (attention FLOPs ~ layers x d_model / TP, KV read ~ KV bytes per token / TP, per-sequence
   overhead ~ layers). The provenance says which terms are fitted and which are transferred.

``max_context`` is that of a current long-context model of the same size (131,072); the profiled
checkpoints themselves were limited to 4,096 tokens, which only bounds the fitted range.

Knobs: ``data_dir`` (default ``/work/shared/data/gpu_profiles``), ``out_dir`` (``router/sim/profiles``),
``tp`` for the 70B profiles (default 4).
Run: ``python -m router.sim.fit_profiles [DATA_DIR] [OUT_DIR]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["fit_splitwise", "fit_vidur", "fit_all", "main"]

DEFAULT_DATA = Path("/work/shared/data/gpu_profiles")
DEFAULT_OUT = Path(__file__).with_name("profiles")

# model shapes: layers, d_model, kv heads, head dim (bytes per KV element = 2, fp16)
_SHAPES = {
    "llama2-70b": (80, 8192, 8, 128),
    "llama-3-8b": (32, 4096, 8, 128),
    "llama-2-7b": (32, 4096, 32, 128),
}
_GPU = {"a100": "a100-80gb", "h100": "h100-80gb"}


def kv_bytes_per_token(model: str) -> int:
    layers, _d, kvh, hd = _SHAPES[model]
    return 2 * layers * kvh * hd * 2


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    from scipy.optimize import nnls

    w = 1.0 / y  # relative error
    coef, _ = nnls(x * w[:, None], y * w)
    return coef


def _mape(pred: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    e = np.abs(pred - y) / y
    return float(e.mean() * 100), float(e.max() * 100)


def fit_splitwise(data_dir: Path, gpu: str, tp: int) -> dict[str, Any]:
    """Fit a..e (seconds) for llama2-70b on ``gpu`` at tensor parallel ``tp``."""
    import pandas as pd

    path = data_dir / "splitwise_perf_model.csv"
    df = pd.read_csv(path)
    df = df[(df["model"] == "llama2-70b") & (df["hardware"] == _GPU[gpu]) & (df["tensor_parallel"] == tp)]
    if df.empty:
        raise ValueError(f"{path}: no llama2-70b rows for {gpu} TP{tp}")
    keys = ["prompt_size", "batch_size", "token_size"]
    g = df.groupby(keys)[["prompt_time", "token_time"]].median().reset_index()
    dropped: list[dict[str, Any]] = []
    by = {(int(r.prompt_size), int(r.batch_size), int(r.token_size)): r for r in g.itertuples()}
    keep = np.ones(len(g), dtype=bool)
    for i, r in enumerate(g.itertuples()):
        prev = by.get((int(r.prompt_size), int(r.batch_size) // 2, int(r.token_size)))
        if int(r.batch_size) >= 64 and prev is not None:
            ratio = float(r.prompt_time) / float(prev.prompt_time)
            if not 1.5 <= ratio <= 2.6:
                keep[i] = False
                dropped.append(
                    {
                        "prompt_size": int(r.prompt_size),
                        "batch_size": int(r.batch_size),
                        "token_size": int(r.token_size),
                        "prompt_time_ms": round(float(r.prompt_time), 1),
                        "ratio_to_half_batch": round(ratio, 3),
                    }
                )
    g = g[keep]
    p, bsz, t = (g[k].to_numpy(float) for k in keys)
    # the tables' prompt time grows ~linearly in batch: a batch-B prompt row is B prefill iterations
    xp = np.stack([bsz, bsz * p, bsz * p * p, np.zeros_like(p), bsz], axis=1)
    xt = np.stack([np.ones_like(p), np.zeros_like(p), np.zeros_like(p), bsz * (p + t / 2), bsz], axis=1)
    yp, yt = g["prompt_time"].to_numpy(float) / 1000, g["token_time"].to_numpy(float) / 1000
    coef = _nnls(np.vstack([xp, xt]), np.concatenate([yp, yt]))
    ep, et = _mape(xp @ coef, yp), _mape(xt @ coef, yt)
    return {
        "coefficients": dict(zip("abcde", (float(v) for v in coef), strict=True)),
        "fit_error": {
            "prompt_rows_mape_pct": round(ep[0], 2),
            "prompt_rows_max_ape_pct": round(ep[1], 2),
            "token_rows_mape_pct": round(et[0], 2),
            "token_rows_max_ape_pct": round(et[1], 2),
            "n_prompt_rows": len(yp),
            "n_token_rows": len(yt),
        },
        "dropped_rows": dropped,
        "source": f"Mutinifni/splitwise-sim @ data/perf_model.csv (MIT): llama2-70b, {_GPU[gpu]}, TP{tp}",
    }


def fit_vidur(data_dir: Path, gpu: str) -> dict[str, Any]:
    """Fit a, b (seconds) of a single-GPU 8B/7B model from vidur's non-attention operator timings."""
    import pandas as pd

    fname, model = {
        "a100": ("a100_llama-3-8b_mlp.csv", "llama-3-8b"),
        "h100": ("h100_llama-2-7b_mlp.csv", "llama-2-7b"),
    }[gpu]
    path = data_dir / "vidur" / fname
    df = pd.read_csv(path)
    df = df[df["num_tensor_parallel_workers"] == 1]
    layer_ops = [
        "input_layernorm",
        "attn_pre_proj",
        "attn_rope",
        "attn_post_proj",
        "post_attention_layernorm",
        "mlp_up_proj",
        "mlp_act",
        "mlp_down_proj",
        "add",
    ]
    layers = _SHAPES[model][0]
    per_iter_ms = df["time_stats.emb.median"] + layers * sum(
        df[f"time_stats.{op}.median"] for op in layer_ops
    )
    agg = pd.DataFrame({"n": df["num_tokens"].to_numpy(float), "t": per_iter_ms.to_numpy(float) / 1000})
    agg = agg.groupby("n")["t"].median().reset_index()
    n, y = agg["n"].to_numpy(), agg["t"].to_numpy()
    x = np.stack([np.ones_like(n), n], axis=1)
    coef = _nnls(x, y)
    err = _mape(x @ coef, y)
    return {
        "model": model,
        "a": float(coef[0]),
        "b": float(coef[1]),
        "fit_error": {
            "mlp_rows_mape_pct": round(err[0], 2),
            "mlp_rows_max_ape_pct": round(err[1], 2),
            "n_rows": len(y),
        },
        "source": f"microsoft/vidur @ data/profiling/compute/{gpu}/.../mlp.csv (MIT): {model}, TP1",
    }


def _profile_70b(data_dir: Path, gpu: str, tp: int) -> dict[str, Any]:
    fit = fit_splitwise(data_dir, gpu, tp)
    return {
        "name": f"{gpu}-llama2-70b-tp{tp}",
        "gpu": gpu,
        "model": "llama2-70b",
        "gpus_per_replica": tp,
        "coefficients": fit["coefficients"],
        "kv_bytes_per_token": kv_bytes_per_token("llama2-70b"),
        "max_context": 131072,
        "token_budget": 8192,
        "max_num_seqs": 256,
        "provenance": {
            "method": "NNLS on relative error over median prompt and token rows (router.sim.fit_profiles)",
            "source": fit["source"],
            "dropped_rows": fit["dropped_rows"],
            "terms": {k: "fitted" for k in "abcde"},
        },
        "fit_error": fit["fit_error"],
    }


def _profile_small(data_dir: Path, gpu: str) -> dict[str, Any]:
    v = fit_vidur(data_dir, gpu)
    big = fit_splitwise(data_dir, gpu, 2)["coefficients"]
    lb, db, _kb, _hb = _SHAPES["llama2-70b"]
    ls, ds, _ks, _hs = _SHAPES[v["model"]]
    tp_ratio = 2 / 1  # the 70B fit ran on 2 GPUs, the small model on one
    attn = (ls * ds) / (lb * db) * tp_ratio
    kv = kv_bytes_per_token(v["model"]) / kv_bytes_per_token("llama2-70b") * tp_ratio
    coef = {"a": v["a"], "b": v["b"], "c": big["c"] * attn, "d": big["d"] * kv, "e": big["e"] * ls / lb}
    return {
        "name": f"{gpu}-{v['model']}",
        "gpu": gpu,
        "model": v["model"],
        "gpus_per_replica": 1,
        "coefficients": coef,
        "kv_bytes_per_token": kv_bytes_per_token(v["model"]),
        "max_context": 131072,
        "token_budget": 8192,
        "max_num_seqs": 256,
        "provenance": {
            "method": "a, b: NNLS of vidur per-iteration non-attention time vs num_tokens; c, d, e: transferred "
            "from the same GPU's llama2-70b TP2 splitwise fit scaled by model shape "
            f"(attention x{attn:.4g}, KV read x{kv:.4g}, per-sequence x{ls / lb:.4g})",
            "source": [v["source"], "Mutinifni/splitwise-sim @ data/perf_model.csv (MIT): llama2-70b TP2"],
            "terms": {
                "a": "fitted",
                "b": "fitted",
                "c": "transferred",
                "d": "transferred",
                "e": "transferred",
            },
        },
        "fit_error": v["fit_error"],
    }


def fit_all(data_dir: Path = DEFAULT_DATA, out_dir: Path = DEFAULT_OUT, tp: int = 4) -> list[Path]:
    """Write one JSON per (gpu, model): ``<gpu>-llama2-70b-tp<tp>`` and the single-GPU 8B/7B profile."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for gpu in ("a100", "h100"):
        for prof in (_profile_70b(data_dir, gpu, tp), _profile_small(data_dir, gpu)):
            p = out_dir / f"{prof['name']}.json"
            p.write_text(json.dumps(prof, indent=2, sort_keys=False) + "\n")
            written.append(p)
    return written


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    data = Path(args[0]) if args else DEFAULT_DATA
    out = Path(args[1]) if len(args) > 1 else DEFAULT_OUT
    for p in fit_all(data, out):
        prof = json.loads(p.read_text())
        print(p.name, {k: f"{v:.3g}" for k, v in prof["coefficients"].items()}, prof["fit_error"])


if __name__ == "__main__":
    main()
