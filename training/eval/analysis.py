"""Sentences and rankings generated from a set's numbers (nothing here changes a figure).

- :func:`comparison_lines`: one sentence per baseline: where the learned policy is better, where
  worse, where equal at the precision shown, on success, cost, AIQ, short-step p95, run completion
  p95, cache hit rate and flaps per run; a success difference below two combined standard errors is
  called "within noise"; then a verdict on success and cost (dominates, is dominated, trades, ties).
- :func:`sensitivity`: the ranking of the policies (tie groups) by success and by AIQ under each
  outcome variant, whether it differs from the base variant's, and the learned policy's rank.

Knobs: ``ours`` (the policy compared, ``learned``) and the tie tolerance of the rankings (1e-9).
"""

from __future__ import annotations

import math
from typing import Any

from training.eval.format import BASE_ORDER, fnum, fpct, fusd, isnum, rows_by_policy

__all__ = ["comparison_lines", "sensitivity", "ranking_text"]

# (key, label, higher is better, formatter)
_CMP = (
    ("success_rate", "success", True, fnum),
    ("cost_usd", "cost", False, fusd),
    ("aiq", "AIQ", True, fnum),
    ("short_step_latency_s_p95", "short-step p95 (s)", False, lambda v: fnum(v, 2)),
    ("run_completion_s_p95", "run completion p95 (s)", False, lambda v: fnum(v, 1)),
    ("cache_hit_rate", "cache hit", True, fpct),
    ("flaps_per_run", "flaps/run", False, lambda v: fnum(v, 2)),
)


def comparison_lines(s: dict[str, Any], ours: str = "learned") -> list[str]:
    """One sentence per baseline: where ``ours`` is better, where worse, from the numbers only.

    Success differences smaller than two combined standard errors are called "within noise".
    """
    rows = rows_by_policy(s)
    me = rows.get(ours)
    if me is None:
        return [f"no `{ours}` row in this set"]
    out = []
    for name in [p for p in BASE_ORDER if p in rows and p != ours] + [
        p for p in rows if p not in BASE_ORDER and p != ours
    ]:
        b = rows[name]
        better, worse, same = [], [], []
        for key, label, hib, fmt in _CMP:
            if not (isnum(me.get(key)) and isnum(b.get(key))):
                continue
            a, c = float(me[key]), float(b[key])
            txt = f"{label} {fmt(a)} vs {fmt(c)}"
            if key == "success_rate":
                se = math.hypot(me.get("success_se") or 0.0, b.get("success_se") or 0.0)
                if se > 0 and abs(a - c) < 2 * se:
                    txt += f" (within noise: 2 SE = {2 * se:.3f})"
            if fmt(a) == fmt(c):  # equal at the precision shown
                same.append(txt)
            elif (a > c) == hib:
                better.append(txt)
            else:
                worse.append(txt)
        verdict = ""
        if all(isnum(r.get(k)) for r in (me, b) for k in ("success_rate", "cost_usd")):
            sa, sb = float(me["success_rate"]), float(b["success_rate"])
            ca, cb = float(me["cost_usd"]), float(b["cost_usd"])
            if sa >= sb and ca <= cb and (sa > sb or ca < cb):
                verdict = "dominates it (at least as good on success and cost, strictly better on one)"
            elif sa <= sb and ca >= cb and (sa < sb or ca > cb):
                verdict = "is dominated by it on success and cost"
            elif sa == sb and ca == cb:
                verdict = "ties it on success and cost"
            else:
                verdict = "trades success against cost with it"
        if not verdict:
            verdict = "has no success figure to compare (no run with both outcomes known)"
        elif cb > 0:
            rel = f"x{ca / cb:.1f}" if ca / cb >= 3 else f"{100 * (ca - cb) / cb:+.1f}%"
            verdict += f" (success {sa - sb:+.3f}, cost {rel})"
        line = f"**vs {name}**: {ours} {verdict}. Better: " + ("; ".join(better) or "nothing")
        line += ". Worse: " + ("; ".join(worse) or "nothing")
        if same:
            line += ". Equal: " + "; ".join(same)
        out.append(line + ".")
    return out


def _ranking(pairs: list[tuple[str, object]], tol: float = 1e-9) -> list[list[str]]:
    """Tie groups, best first: [[a], [b, c], ...] (values within ``tol`` tie; missing values last)."""
    vals = sorted(pairs, key=lambda t: -(t[1] if isnum(t[1]) else -math.inf))
    groups: list[list[str]] = []
    last: Any = None
    for name, v in vals:
        if groups and (
            (isnum(v) and isnum(last) and abs(v - last) <= tol) or (not isnum(v) and not isnum(last))
        ):
            groups[-1].append(name)
        else:
            groups.append([name])
        last = v
    return [sorted(g) for g in groups]


def ranking_text(groups: list[list[str]]) -> str:
    return " > ".join(" = ".join(g) for g in groups)


def sensitivity(s: dict[str, Any], variants: list[str]) -> dict[str, Any]:
    """Rankings (tie groups) by success and by AIQ under each outcome variant, whether they differ from
    the first (base) variant's, and the learned policy's rank (1 + policies strictly better)."""
    rows = s.get("policies", [])
    out: dict[str, Any] = {"by_success": {}, "by_aiq": {}}
    for v in variants:
        out["by_success"][v] = _ranking(
            [(r["policy"], (r.get("success_by_variant") or {}).get(v)) for r in rows]
        )
        out["by_aiq"][v] = _ranking([(r["policy"], (r.get("aiq_by_variant") or {}).get(v)) for r in rows])
    if variants:
        b = variants[0]
        out["success_ranking_changes"] = {
            v: out["by_success"][v] != out["by_success"][b] for v in variants[1:]
        }
        out["aiq_ranking_changes"] = {v: out["by_aiq"][v] != out["by_aiq"][b] for v in variants[1:]}
        for key in ("success", "aiq"):
            lr: dict[str, int | None] = {}
            for v in variants:
                groups = out[f"by_{key}"][v]
                ahead = 0
                lr[v] = None
                for g in groups:
                    if "learned" in g:
                        lr[v] = ahead + 1
                        break
                    ahead += len(g)
            out[f"learned_{key}_rank"] = lr
    return out
