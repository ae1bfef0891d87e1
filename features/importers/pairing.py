"""Weak-vs-strong pairing: which tasks need the frontier model.

Algorithm: take the run records of the two models (``Run.model`` equal to ``weak_model`` /
``strong_model``), group them by (source, task_id), and score each model on a task by the mean of its
runs' success (reward == 1 -> 1, else 0; runs with an unknown outcome are ignored). A model *succeeds*
on a task when that mean is > ``threshold`` (0.5: the majority of its trials; a single trial is just
its outcome; a tie counts as failure). Only tasks that both models ran are labelled:

- ``needs_frontier``: the weak model fails and the strong one succeeds,
- ``both_fail``: both fail,
- ``weak_ok``: the weak model succeeds (whatever the strong one did).

:func:`label_weak_runs` writes the labels onto the weak model's run records: ``needs_frontier``
(True only for ``needs_frontier`` tasks), ``pair_label``, ``strong_model``, ``strong_outcome``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["pair_outcomes", "label_weak_runs", "label_domain_runs", "PAIR_LABELS"]

PAIR_LABELS = ("needs_frontier", "both_fail", "weak_ok")


def _runs(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["record"] == "run"] if "record" in df.columns else df


def pair_outcomes(
    runs_df: pd.DataFrame, weak_model: str, strong_model: str, *, threshold: float = 0.5
) -> pd.DataFrame:
    """Per-task labels; columns: source, task_id, weak_success, strong_success, weak_runs,
    strong_runs, pair_label. Raises :class:`features.runlog.RunLogError` when a model has no runs."""
    import pandas as pd

    from features.runlog import RunLogError

    runs = _runs(runs_df)
    runs = runs[runs["outcome"].isin(["success", "failure"]) & runs["task_id"].notna()]
    present = sorted(str(m) for m in runs["model"].dropna().unique())
    scores = {}
    for role, model in (("weak", weak_model), ("strong", strong_model)):
        sel = runs[runs["model"] == model]
        if sel.empty:
            raise RunLogError(
                f"no runs with a known outcome for model '{model}' (models present: {', '.join(present)})"
            )
        g = sel.assign(ok=(sel["outcome"] == "success").astype(float)).groupby(["source", "task_id"])["ok"]
        scores[role] = pd.DataFrame({f"{role}_mean": g.mean(), f"{role}_runs": g.size()})
    both = scores["weak"].join(scores["strong"], how="inner").reset_index()
    both["weak_success"] = both["weak_mean"] > threshold
    both["strong_success"] = both["strong_mean"] > threshold
    label = pd.Series("both_fail", index=both.index, dtype=object)
    label[~both["weak_success"] & both["strong_success"]] = "needs_frontier"
    label[both["weak_success"]] = "weak_ok"
    both["pair_label"] = label
    return both[
        ["source", "task_id", "weak_success", "strong_success", "weak_runs", "strong_runs", "pair_label"]
    ]


def label_weak_runs(
    df: pd.DataFrame, weak_model: str, strong_model: str, *, threshold: float = 0.5
) -> pd.DataFrame:
    """Copy of the run-log frame with the pairing labels written onto the weak model's runs.

    Weak runs whose task the strong model did not run keep null labels."""
    pairs = pair_outcomes(df, weak_model, strong_model, threshold=threshold)
    out = df.copy()
    key = pairs.set_index(["source", "task_id"])
    is_weak = (out["record"] == "run") & (out["model"] == weak_model)
    idx = out.index[is_weak]
    keys = list(zip(out.loc[idx, "source"], out.loc[idx, "task_id"], strict=True))
    found = [k in key.index for k in keys]
    for col in ("needs_frontier", "pair_label", "strong_model", "strong_outcome"):
        out[col] = out[col].astype(object)
    for i, k, ok in zip(idx, keys, found, strict=True):
        if not ok:
            continue
        row = key.loc[k]
        out.at[i, "pair_label"] = row["pair_label"]
        out.at[i, "needs_frontier"] = bool(row["pair_label"] == "needs_frontier")
        out.at[i, "strong_model"] = strong_model
        out.at[i, "strong_outcome"] = "success" if bool(row["strong_success"]) else "failure"
    return out


# ------------------------------------------------------------------ per-domain roles, per-run labels


def _players(runs: pd.DataFrame) -> pd.Series:
    """``agent/model`` per run: one submission of one model (a file of tau2 trajectories)."""
    return runs["agent"].fillna("?").astype(str) + "/" + runs["model"].fillna("?").astype(str)


def _matches(runs: pd.DataFrame, name: str) -> pd.Series:
    """Runs a role name designates: the name equals the run's agent, its model or ``agent/model``."""
    return (runs["agent"] == name) | (runs["model"] == name) | (_players(runs) == name)


def label_domain_runs(
    df: pd.DataFrame,
    *,
    weak: tuple[str, ...] | None = None,
    strong: dict[str, str] | None = None,
    min_task_share: float = 0.3,
) -> pd.DataFrame:
    """Copy of a run-log frame with per-*run* weak-vs-strong labels, domain by domain.

    Algorithm: a run's domain is the part of its ``task_id`` before ``/`` (tau2: ``airline/3``); a
    *player* is one submission of one model (``agent/model``). Per domain:

    - the **strong** player is ``strong[domain]`` when given (a name that matches the run's agent,
      model or ``agent/model``), else the player with the highest success rate among those that ran
      at least ``min_task_share`` of the domain's tasks (ties: more runs, then name);
    - the **weak** players are those named in ``weak`` (same matching), else every other player of
      the domain (the weaker models stand in for the local model: a real local model, qwen2.5-7b on
      ollama, is one of them in airline);
    - the strong outcome of a task = success iff the strong player's mean success on it > 0.5.

    Each weak run whose task the strong player ran gets, from **its own outcome** (never a task
    majority): ``pair_label`` = ``weak_ok`` when it succeeded (so it is never needs-frontier),
    ``needs_frontier`` when it failed and the strong outcome is success, else ``both_fail``;
    ``needs_frontier`` accordingly, ``strong_model`` = the strong player, ``strong_outcome``.
    Every other run of a labelled domain (the strong player's, players not named weak, tasks the
    strong player did not run) has its pairing labels cleared, so re-labelling with other roles
    starts afresh.
    Assumption stated for the benefit target: the strong player's outcome on the same task stands in
    for "escalate now" at any step of the weak run.
    """
    import pandas as pd

    out = df.copy()
    for col in ("needs_frontier", "pair_label", "strong_model", "strong_outcome"):
        out[col] = out[col].astype(object)
    is_run = (out["record"] == "run") & out["task_id"].notna() & out["outcome"].isin(["success", "failure"])
    runs = out[is_run]
    domain = runs["task_id"].astype(str).str.split("/", n=1).str[0]
    player = _players(runs)
    ok = (runs["outcome"] == "success").astype(float)
    for dom in sorted(domain.unique()):
        sel = domain == dom
        r = runs[sel]
        n_tasks = r["task_id"].nunique()
        if strong and dom in strong:
            sp = sorted(set(player[sel][_matches(r, strong[dom])]))
            if not sp:
                continue
            strong_player = sp[0]
        else:
            stats = [
                (float(ok[sel][player[sel] == p].mean()), int((player[sel] == p).sum()), p)
                for p in sorted(set(player[sel]))
                if r.loc[player[sel] == p, "task_id"].nunique() >= min_task_share * n_tasks
            ]
            if not stats:
                continue
            strong_player = max(stats, key=lambda t: (t[0], t[1], t[2]))[2]
        for col in ("needs_frontier", "pair_label", "strong_model", "strong_outcome"):
            out.loc[runs.index[sel], col] = None  # earlier labels of this domain: the roles decide anew
        s_sel = sel & (player == strong_player)
        s_mean = ok[s_sel].groupby(runs.loc[s_sel, "task_id"]).mean()
        s_ok = {t: bool(v > 0.5) for t, v in s_mean.items()}
        w_sel = sel & (player != strong_player)
        if weak:
            hit = pd.Series(False, index=runs.index)
            for name in weak:
                hit |= _matches(runs, name)
            w_sel &= hit
        for i in runs.index[w_sel]:
            t = runs.at[i, "task_id"]
            if t not in s_ok:
                continue
            own = runs.at[i, "outcome"] == "success"
            label = "weak_ok" if own else ("needs_frontier" if s_ok[t] else "both_fail")
            out.at[i, "pair_label"] = label
            out.at[i, "needs_frontier"] = label == "needs_frontier"
            out.at[i, "strong_model"] = strong_player
            out.at[i, "strong_outcome"] = "success" if s_ok[t] else "failure"
    return out
