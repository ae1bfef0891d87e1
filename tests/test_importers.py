"""Importers: tiny hand-made fixtures of each source format -> run-log records with the documented rules."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from features.importers import SOURCES, import_source, looks_like_error, tool_call_key
from features.importers.azure import import_azure
from features.importers.mooncake import import_mooncake
from features.importers.pairing import label_weak_runs, pair_outcomes
from features.importers.servegen import import_servegen
from features.importers.summary import summarize
from features.importers.swebench_pro import import_swebench_pro
from features.importers.tau2bench import import_tau2bench
from features.importers.taubench import import_taubench
from features.runlog import BadRow, RunLogError, read_records, write_frame
from features.samples import sample_files

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _steps(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["record"] == "step"].sort_values(["run_id", "step"]).reset_index(drop=True)


def _runs(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["record"] == "run"].set_index("run_id")


def _valid(df: pd.DataFrame, tmp_path: Path) -> pd.DataFrame:
    """Every importer output must pass the run-log reader's strict validation."""
    p = write_frame(df, tmp_path / "check.parquet")
    return read_records(p, strict=True, quarantine=False).frame


# ----------------------------------------------------------------------------- mooncake


def _mooncake(tmp_path: Path, reqs: list[dict], extra_lines: list[str] = ()) -> Path:
    p = tmp_path / "trace.jsonl"
    lines = [json.dumps(r) for r in reqs] + list(extra_lines)
    p.write_text("\n".join(lines) + "\n")
    return p


def _req(ts_ms: int, blocks: list[int], inp: int | None = None, out: int = 30) -> dict:
    return {
        "timestamp": ts_ms,
        "input_length": inp if inp is not None else 512 * len(blocks),
        "output_length": out,
        "hash_ids": blocks,
    }


def test_mooncake_chains_on_shared_leading_blocks(tmp_path):
    reqs = [
        _req(0, [0, 1, 2]),  # A: new run
        _req(1000, [0, 7]),  # X: shares only block 0 -> new run
        _req(10_000, [0, 1, 2, 3], inp=1800),  # B: continues A (3 shared blocks)
        _req(20_000, [0, 1, 2, 3, 4]),  # C: continues B (deepest shared node [0..3], latest = B)
        _req(30_000, [0, 1, 2, 9]),  # D: deepest shared [0,1,2]: latest request there is C -> continues C
        _req(40_000, [0, 1, 2, 3, 4, 5]),  # E: deepest [0..4], latest = C, but the run moved on to D -> fork
    ]
    df = import_mooncake(_mooncake(tmp_path, reqs), decode_tokens_per_s=None)
    _valid(df, tmp_path)
    st = df[df["record"] == "step"].reset_index(drop=True)  # file order
    run_of = list(st["run_id"])
    a, x, b, c, d, e = run_of
    assert a == b == c == d
    assert len({a, x, e}) == 3
    assert list(st["step"]) == [0, 0, 1, 2, 3, 0]
    # infinite-cache upper bound: leading blocks shared with ANY earlier request, capped at the prompt
    assert list(st["prefix_reuse_tokens"]) == [0, 512, 1536, 2048, 1536, 2560]
    assert st.loc[2, "prompt_tokens"] == 1800 and st.loc[2, "prefix_reuse_tokens"] <= 1800
    # arrival in seconds; pause = plain arrival gap when decode_tokens_per_s is None
    assert list(st["arrival_s"]) == [0.0, 1.0, 10.0, 20.0, 30.0, 40.0]
    assert st.loc[2, "tool_pause_s"] == pytest.approx(10.0)
    assert pd.isna(st.loc[0, "tool_pause_s"]) and pd.isna(st.loc[5, "tool_pause_s"])
    assert list(st.loc[3, "hash_ids"]) == [0, 1, 2, 3, 4]
    runs = _runs(df)
    assert set(runs["outcome"]) == {"unknown"} and set(runs["source"]) == {"mooncake"}
    assert runs.loc[a, "n_steps"] == 4 and runs.loc[a, "ended_at"] == 30.0


def test_mooncake_pause_subtracts_estimated_previous_duration(tmp_path):
    reqs = [_req(0, [0, 1, 2], out=300), _req(60_000, [0, 1, 2, 3], out=10), _req(61_000, [0, 1, 2, 3, 4])]
    st = _steps(import_mooncake(_mooncake(tmp_path, reqs), decode_tokens_per_s=30.0))
    assert st.loc[1, "tool_pause_s"] == pytest.approx(60.0 - 300 / 30.0)
    assert st.loc[2, "tool_pause_s"] == pytest.approx(1.0 - 10 / 30.0)


def test_mooncake_min_shared_blocks_knob(tmp_path):
    reqs = [_req(0, [0, 1]), _req(1000, [0, 5])]
    p = _mooncake(tmp_path, reqs)
    assert _runs(import_mooncake(p)).shape[0] == 2
    assert _runs(import_mooncake(p, min_shared_blocks=1)).shape[0] == 1


def test_mooncake_bad_rows_quarantined_or_strict(tmp_path):
    reqs = [_req(0, [0, 1]), {"timestamp": 5, "input_length": -3, "output_length": 1, "hash_ids": [0]}]
    p = _mooncake(tmp_path, reqs, extra_lines=['{"timestamp": 9, "input_len'])
    bad: list[BadRow] = []
    df = import_mooncake(p, bad_rows=bad)
    assert len(_steps(df)) == 1
    assert [(b.row, b.reason.split(" (")[0]) for b in bad] == [
        (2, "negative 'input_length'"),
        (3, "invalid JSON"),
    ]
    with pytest.raises(RunLogError, match=r"trace.jsonl:2: negative 'input_length'"):
        import_mooncake(p, strict=True)


def test_mooncake_until_s_cuts_a_prefix_of_the_full_import(tmp_path):
    reqs = [_req(i * 1000, [0, 1, 2 + (i % 3)] + list(range(100, 100 + i))) for i in range(12)]
    p = _mooncake(tmp_path, reqs)
    full, cut = _steps(import_mooncake(p)), _steps(import_mooncake(p, until_s=6.0))
    assert len(cut) == 6
    merged = cut.merge(full, on=["arrival_s"], suffixes=("_cut", "_full"))
    assert (merged["prefix_reuse_tokens_cut"] == merged["prefix_reuse_tokens_full"]).all()


# ----------------------------------------------------------------------------- tau-bench


def _taubench_sim(task: int, trial: int, reward: float, n_lookups: int = 1, error: bool = False) -> dict:
    traj = [
        {"role": "system", "content": "policy " * 100},
        {"role": "user", "content": "hello, change my flight"},
    ]
    for i in range(n_lookups):
        traj.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": "get_user_details", "arguments": '{"user_id": "u1"}'},
                    }
                ],
            }
        )
        content = "Error: user not found" if error and i == 0 else json.dumps({"name": "Mia", "i": i})
        traj.append({"role": "tool", "tool_call_id": f"c{i}", "name": "get_user_details", "content": content})
    traj.append({"role": "assistant", "content": "Done, your flight is changed."})
    return {"task_id": task, "reward": reward, "info": {}, "traj": traj, "trial": trial}


def test_taubench_one_step_per_assistant_message(tmp_path):
    p = tmp_path / "gpt-4o-airline.json"
    p.write_text(json.dumps([_taubench_sim(0, 0, 1.0, n_lookups=2, error=True), _taubench_sim(1, 3, 0.0)]))
    df = import_taubench(p)
    _valid(df, tmp_path)
    runs = _runs(df)
    assert list(runs.index) == ["taubench-airline-t0-r0", "taubench-airline-t1-r3"]
    assert list(runs["outcome"]) == ["success", "failure"]
    assert list(runs["needs_frontier"]) == [False, True]
    assert list(runs["task_id"]) == ["airline/0", "airline/1"] and set(runs["model"]) == {"gpt-4o"}
    st = _steps(df)
    s0 = st[st["run_id"] == "taubench-airline-t0-r0"].reset_index(drop=True)
    assert len(s0) == 3 and runs.loc["taubench-airline-t0-r0", "n_steps"] == 3
    assert [list(x) for x in s0["tool_calls"]] == [["get_user_details"], ["get_user_details"], []]
    keys = [list(x) for x in s0["tool_call_keys"]]
    assert keys[0] == keys[1] == [tool_call_key("get_user_details", {"user_id": "u1"})]
    assert list(s0["structured"]) == [True, True, False]
    # results consumed: step k sees the tool messages since step k-1
    assert list(s0["tool_results_n"]) == [0, 1, 1]
    assert [list(x) for x in s0["tool_result_errors"]] == [[], [True], [False]]
    # estimated prompts grow, and repeat the previous prompt + output (capped at the prompt)
    pt = list(s0["prompt_tokens"])
    assert pt[0] > 100 and pt[0] < pt[1] < pt[2]
    assert s0.loc[0, "prefix_reuse_tokens"] == 0
    assert s0.loc[1, "prefix_reuse_tokens"] == min(pt[1], pt[0] + s0.loc[0, "completion_tokens"])
    assert s0["arrival_s"].isna().all()  # tau-bench logs no times


def test_taubench_truncated_file_is_one_line_error(tmp_path):
    p = tmp_path / "gpt-4o-airline.json"
    p.write_text(json.dumps([_taubench_sim(0, 0, 1.0)])[:-40])
    with pytest.raises(RunLogError, match="not valid JSON") as e:
        import_taubench(p)
    assert "\n" not in str(e.value)


def test_error_heuristic():
    assert looks_like_error("Error: not enough seats")
    assert looks_like_error('{"error": "bad id"}')
    assert not looks_like_error('{"name": "Error Prone"}')
    assert not looks_like_error("")


# ----------------------------------------------------------------------------- tau2-bench


def _tau2_file(tmp_path: Path, llm: str, rewards: dict[str, float], name: str, usage: bool = True) -> Path:
    sims = []
    for task, reward in rewards.items():
        msgs = [
            {
                "role": "assistant",
                "content": "Hi! How can I help you today?",
                "tool_calls": None,
                "turn_idx": 0,
                "timestamp": "2025-01-01T00:00:00.000000",
                "usage": None,
            },
            {
                "role": "user",
                "content": "cancel my trip",
                "turn_idx": 1,
                "timestamp": "2025-01-01T00:00:05.000000",
            },
            {
                "role": "assistant",
                "content": None,
                "turn_idx": 2,
                "timestamp": "2025-01-01T00:00:07.000000",
                "tool_calls": [
                    {
                        "id": "t1",
                        "name": "get_reservation_details",
                        "arguments": {"reservation_id": "X"},
                        "requestor": "assistant",
                    }
                ],
                "usage": {"prompt_tokens": 3000, "completion_tokens": 20} if usage else None,
            },
            {
                "role": "tool",
                "id": "t1",
                "content": "Reservation not found",
                "requestor": "assistant",
                "error": True,
                "turn_idx": 3,
                "timestamp": "2025-01-01T00:00:07.500000",
            },
            {
                "role": "tool",
                "id": "u1",
                "content": "ok",
                "requestor": "user",
                "error": False,
                "turn_idx": 4,
                "timestamp": "2025-01-01T00:00:07.600000",
            },
            {
                "role": "assistant",
                "content": "I could not find it.",
                "tool_calls": None,
                "turn_idx": 5,
                "timestamp": "2025-01-01T00:00:09.600000",
                "usage": {"prompt_tokens": 3100, "completion_tokens": 8} if usage else None,
            },
        ]
        sims.append(
            {
                "id": f"s{task}",
                "task_id": task,
                "trial": 0,
                "start_time": "2025-01-01T00:00:00",
                "end_time": "2025-01-01T00:00:10",
                "reward_info": {"reward": reward},
                "messages": msgs,
            }
        )
    doc = {
        "timestamp": "x",
        "info": {
            "agent_info": {"implementation": "llm_agent", "llm": llm},
            "environment_info": {"domain_name": "airline", "policy": "be nice " * 50},
        },
        "tasks": [],
        "simulations": sims,
    }
    p = tmp_path / f"{name}__airline.json"
    p.write_text(json.dumps(doc))
    return p


def test_tau2_steps_usage_times_and_tool_results(tmp_path):
    p = _tau2_file(tmp_path, "openai/weak-1", {"0": 1.0, "1": 0.0}, "sub-a")
    df = import_tau2bench(p)
    _valid(df, tmp_path)
    runs = _runs(df)
    assert list(runs.index) == ["tau2-airline-weak-1-sub-a-t0-r0", "tau2-airline-weak-1-sub-a-t1-r0"]
    assert set(runs["model"]) == {"weak-1"} and set(runs["agent"]) == {"sub-a"}
    assert list(runs["outcome"]) == ["success", "failure"] and list(runs["task_id"]) == [
        "airline/0",
        "airline/1",
    ]
    st = _steps(df)
    s = st[st["run_id"] == runs.index[0]].reset_index(drop=True)
    assert len(s) == 2  # the canned greeting is not a generation
    assert list(s["prompt_tokens"]) == [3000, 3100] and list(s["completion_tokens"]) == [20, 8]
    assert s.loc[0, "arrival_s"] == pytest.approx(1735689605.0)  # the user message before it
    assert s.loc[0, "latency_s"] == pytest.approx(2.0)
    assert s.loc[1, "tool_pause_s"] == pytest.approx(0.6)  # 07.6 (last message) - 07.0 (previous step)
    assert s.loc[1, "latency_s"] == pytest.approx(2.0)
    # only the agent's tool result counts; its logged error flag is used
    assert s.loc[1, "tool_results_n"] == 1 and list(s.loc[1, "tool_result_errors"]) == [True]


def test_tau2_estimates_without_usage_and_directory_input(tmp_path):
    _tau2_file(tmp_path, "weak-1", {"0": 1.0}, "sub-a", usage=False)
    _tau2_file(tmp_path, "strong-1", {"0": 1.0}, "sub-b")
    df = import_tau2bench(tmp_path)
    st = _steps(df)
    est = st[st["run_id"].str.contains("weak-1")]
    assert est["prompt_tokens"].iloc[0] > 50 * 8 / 4  # includes the policy as system prompt
    assert est["prompt_tokens"].iloc[1] > est["prompt_tokens"].iloc[0]
    assert len(_runs(df)) == 2


# ----------------------------------------------------------------------------- pairing


def _pair_frame() -> pd.DataFrame:
    rows = []
    outcomes = {  # task -> (weak trial outcomes, strong trial outcomes)
        "a": (["failure"], ["success"]),  # needs_frontier
        "b": (["failure", "failure", "success"], ["failure"]),  # majority fail, both fail
        "c": (["success", "success", "failure"], ["failure"]),  # weak ok (majority)
        "d": (["success", "failure"], ["success", "success"]),  # tie counts as failure -> needs_frontier
        "e": (["success"], []),  # strong did not run it -> unlabelled
    }
    for task, (weak, strong) in outcomes.items():
        for model, outs in (("w", weak), ("s", strong)):
            for i, o in enumerate(outs):
                rows.append(
                    {
                        "record": "run",
                        "run_id": f"{model}-{task}-{i}",
                        "source": "x",
                        "task_id": task,
                        "model": model,
                        "outcome": o,
                        "needs_frontier": None,
                        "pair_label": None,
                        "strong_model": None,
                        "strong_outcome": None,
                    }
                )
    return pd.DataFrame(rows)


def test_pair_outcomes_majority_rule():
    pairs = pair_outcomes(_pair_frame(), "w", "s").set_index("task_id")
    assert pairs["pair_label"].to_dict() == {
        "a": "needs_frontier",
        "b": "both_fail",
        "c": "weak_ok",
        "d": "needs_frontier",
    }
    assert pairs.loc["b", "weak_runs"] == 3


def test_label_weak_runs_writes_labels_on_weak_runs_only():
    out = label_weak_runs(_pair_frame(), "w", "s").set_index("run_id")
    assert out.loc["w-a-0", "needs_frontier"] is True and out.loc["w-a-0", "strong_outcome"] == "success"
    assert out.loc["w-c-2", "pair_label"] == "weak_ok" and out.loc["w-c-2", "needs_frontier"] is False
    assert out.loc["w-e-0", "pair_label"] is None  # no strong run on that task
    assert out.loc["s-a-0", "pair_label"] is None


def test_pairing_unknown_model_names_the_models_present():
    with pytest.raises(RunLogError, match="models present: s, w"):
        pair_outcomes(_pair_frame(), "nope", "s")


def test_swebench_pro_runs_and_pairing(tmp_path):
    (tmp_path / "eval_results__small.json").write_text(json.dumps({"i1": False, "i2": True, "i3": False}))
    (tmp_path / "eval_results__big.json").write_text(
        json.dumps({"i1": True, "i2": True, "i3": False, "i4": True})
    )
    df = import_swebench_pro(tmp_path)
    _valid(df, tmp_path)
    assert not (df["record"] == "step").any()
    runs = _runs(df)
    assert runs.loc["swebench-pro-small-i2", "outcome"] == "success"
    labels = pair_outcomes(df, "small", "big").set_index("task_id")["pair_label"].to_dict()
    assert labels == {"i1": "needs_frontier", "i2": "weak_ok", "i3": "both_fail"}


def test_swebench_pro_non_boolean_is_a_bad_row(tmp_path):
    p = tmp_path / "eval_results__m.json"
    p.write_text(json.dumps({"i1": True, "i2": "maybe"}))
    bad: list[BadRow] = []
    assert len(import_swebench_pro(p, bad_rows=bad)) == 1
    assert bad[0].row == 2 and "not true/false" in bad[0].reason


# ----------------------------------------------------------------------------- arrivals and rates


def test_azure_arrivals_relative_and_bad_rows(tmp_path):
    p = tmp_path / "AzureLLMInferenceTrace_code.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.5000000,100,10\n"
        "2023-11-16 18:17:05.0000000,-5,3\n"
        "2023-11-16 18:17:04.0000000,200,20\n"
    )
    bad: list[BadRow] = []
    df = import_azure(p, bad_rows=bad)
    _valid(df, tmp_path)
    assert set(df["record"]) == {"arrival"} and set(df["source"]) == {"azure-code"}
    assert list(df["arrival_s"]) == pytest.approx([0.0, 0.5])
    assert list(df["prompt_tokens"]) == [100, 200]
    assert [(b.row, b.reason) for b in bad] == [(3, "negative 'ContextTokens'")]


def test_servegen_windows(tmp_path):
    d = tmp_path / "m-large"
    d.mkdir()
    (d / "chunk-7-trace.csv").write_text("0,1.5,2.0,Gamma,0.2,3.0\n600,0,0,,0,0\n1200,-1,1,Gamma,1,1\n")
    bad: list[BadRow] = []
    df = import_servegen(d, bad_rows=bad)
    _valid(df, tmp_path)
    assert list(df["client"]) == ["m-large/7", "m-large/7"]
    assert list(df["start_s"]) == [0.0, 600.0] and list(df["rate"]) == [1.5, 0.0]
    assert set(df["duration_s"]) == {600.0} and set(df["source"]) == {"servegen-m-large"}
    assert [(b.row, b.reason) for b in bad] == [(3, "negative rate")]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_missing_and_empty_inputs_are_one_line_errors(tmp_path, source):
    with pytest.raises(RunLogError, match="no such file"):
        import_source(source, tmp_path / "nope.json")
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    with pytest.raises(RunLogError, match="empty file"):
        import_source(source, empty)


# ----------------------------------------------------------------------------- summary


def test_summary_figures_from_the_frame(tmp_path):
    p = tmp_path / "gpt-4o-airline.json"
    p.write_text(json.dumps([_taubench_sim(0, 0, 1.0, n_lookups=2), _taubench_sim(1, 0, 0.0, n_lookups=1)]))
    df = import_taubench(p)
    s = summarize(df)["taubench"]
    assert s["runs"] == 2 and s["steps"] == 5 and s["success_rate"] == 0.5
    assert s["steps_p50_success"] == 3 and s["steps_p50_failure"] == 2
    assert s["tool_mix"] == [("get_user_details", 1.0)]
    st = _steps(df)
    assert s["prefix_reuse_ub"] == pytest.approx(st["prefix_reuse_tokens"].sum() / st["prompt_tokens"].sum())


def test_shipped_samples_are_valid_run_logs():
    files = sample_files()
    assert files, "data/ ships no samples"
    for f in files:
        assert len(read_records(f, strict=True, quarantine=False).frame) > 0


@pytest.mark.slow
def test_full_taubench_import_matches_the_data_readme():
    path = SHARED / "taubench" / "gpt-4o-airline.json"
    if not path.exists():
        pytest.skip("../shared/data not present")
    s = summarize(import_taubench(path))["taubench"]
    assert s["runs"] == 200 and round(s["success_rate"], 2) == 0.42
    assert s["steps_p50_failure"] == 13 and 8 <= s["steps_p50_success"] <= 8.5
