"""Run logs written by the importers round-trip through Parquet and JSONL; bad input through the CLI
(`runroute summarize` / `runroute import`) gives one-line errors, exit codes, and quarantine files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pandas as pd
import pytest

from features.importers.mooncake import import_mooncake
from features.runlog import read_records, write_frame
from features.schema import SCHEMA_VERSION

KEY_COLS = [
    "record",
    "run_id",
    "step",
    "prompt_tokens",
    "completion_tokens",
    "prefix_reuse_tokens",
    "arrival_s",
    "tool_pause_s",
    "outcome",
    "n_steps",
]


def _trace(tmp_path: Path) -> Path:
    reqs = [(0, [0, 1, 2]), (5000, [0, 1, 2, 3]), (6000, [0, 9]), (9000, [0, 1, 2, 3, 4])]
    p = tmp_path / "trace.jsonl"
    p.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 512 * len(h) - 7, "output_length": 40, "hash_ids": h})
            + "\n"
            for t, h in reqs
        )
    )
    return p


def _norm(df: pd.DataFrame) -> pd.DataFrame:
    out = df[KEY_COLS].copy()
    for c in ("step", "prompt_tokens", "completion_tokens", "prefix_reuse_tokens", "n_steps"):
        out[c] = pd.to_numeric(out[c]).astype("Float64")
    for c in ("arrival_s", "tool_pause_s"):
        out[c] = pd.to_numeric(out[c]).astype("Float64")
    return out.sort_values(["record", "run_id", "step"]).reset_index(drop=True)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_round_trip(tmp_path, suffix):
    df = import_mooncake(_trace(tmp_path))
    p = write_frame(df, tmp_path / f"log{suffix}")
    back = read_records(p, strict=True).frame
    pd.testing.assert_frame_equal(_norm(back), _norm(df), check_dtype=False)
    hs = back[back["record"] == "step"].sort_values("arrival_s")["hash_ids"].map(list).tolist()
    assert hs[-1] == [0, 1, 2, 3, 4]


def test_jsonl_to_parquet_to_jsonl_is_stable(tmp_path):
    df = import_mooncake(_trace(tmp_path))
    a = write_frame(df, tmp_path / "a.jsonl")
    b = write_frame(read_records(a, strict=True).frame, tmp_path / "b.parquet")
    c = write_frame(read_records(b, strict=True).frame, tmp_path / "c.jsonl")
    rows_a = sorted(a.read_text().splitlines())
    rows_c = sorted(c.read_text().splitlines())
    assert [json.loads(x) for x in rows_a] == [json.loads(x) for x in rows_c]


# ----------------------------------------------------------------------------- CLI, in process


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """runroute.cli.app (the console script) with argv; returns (exit code, stdout, stderr)."""
    from runroute.cli import app

    monkeypatch.setattr(sys, "argv", ["runroute", *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as e:
        app()
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def _good_log(tmp_path: Path) -> Path:
    return write_frame(import_mooncake(_trace(tmp_path)), tmp_path / "log.jsonl")


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_summarize_good_file(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(["summarize", str(_good_log(tmp_path))], monkeypatch, capsys)
    assert code == 0, err
    assert "prefix-reuse upper bound" in out and "mooncake" in out


def test_truncated_jsonl_line_quarantined_by_default_strict_fails(tmp_path, monkeypatch, capsys):
    p = _good_log(tmp_path)
    lines = p.read_text().splitlines()
    lines[2] = lines[2][: len(lines[2]) // 2]
    p.write_text("\n".join(lines) + "\n")
    code, out, err = run_cli(["summarize", str(p)], monkeypatch, capsys)
    assert code == 0, err
    assert "1 bad row(s) quarantined" in out
    rejected = p.with_name(p.name + ".rejected.jsonl")
    rows = [orjson.loads(x) for x in rejected.read_bytes().splitlines()]
    assert [(r["row"], r["reason"].startswith("invalid JSON")) for r in rows] == [(3, True)]
    code, out, err = run_cli(["summarize", "--strict", str(p)], monkeypatch, capsys)
    assert code == 2
    assert f"{p}:3: invalid JSON" in _one_line(err)


def test_negative_tokens_row(tmp_path, monkeypatch, capsys):
    p = _good_log(tmp_path)
    lines = p.read_text().splitlines()
    rec = json.loads(lines[-1])
    assert rec["record"] == "step"
    rec["prompt_tokens"] = -5
    rec.pop("prefix_reuse_tokens", None)
    lines[-1] = json.dumps(rec)
    p.write_text("\n".join(lines) + "\n")
    code, out, err = run_cli(["summarize", str(p)], monkeypatch, capsys)
    assert code == 0 and "1 bad row(s) quarantined" in out and "negative 'prompt_tokens'" in out
    code, out, err = run_cli(["summarize", "--strict", str(p)], monkeypatch, capsys)
    assert code == 2 and f"{p}:{len(lines)}: negative 'prompt_tokens'" in _one_line(err)


def test_newer_schema_version(tmp_path, monkeypatch, capsys):
    p = _good_log(tmp_path)
    text = p.read_text().replace(
        f'"schema_version":{SCHEMA_VERSION}', f'"schema_version":{SCHEMA_VERSION + 1}'
    )
    assert text != p.read_text()
    p.write_text(text)
    code, out, err = run_cli(["summarize", str(p)], monkeypatch, capsys)
    assert code == 2
    assert f"schema version {SCHEMA_VERSION + 1}" in _one_line(err)


@pytest.mark.parametrize("cmd", [["summarize"], ["import", "mooncake"]])
def test_missing_path(tmp_path, monkeypatch, capsys, cmd):
    extra = ["-o", str(tmp_path / "out.parquet")] if cmd[0] == "import" else []
    code, out, err = run_cli([*cmd, str(tmp_path / "nope.jsonl"), *extra], monkeypatch, capsys)
    assert code == 2
    assert "nope.jsonl: no such file" in _one_line(err)


@pytest.mark.parametrize("cmd", [["summarize"], ["import", "mooncake"]])
def test_empty_file(tmp_path, monkeypatch, capsys, cmd):
    p = tmp_path / "empty.jsonl"
    p.write_bytes(b"")
    extra = ["-o", str(tmp_path / "out.parquet")] if cmd[0] == "import" else []
    code, out, err = run_cli([*cmd, str(p), *extra], monkeypatch, capsys)
    assert code == 2
    assert "empty.jsonl: empty file" in _one_line(err)


def test_import_quarantines_bad_source_rows_next_to_the_output(tmp_path, monkeypatch, capsys):
    src = _trace(tmp_path)
    with open(src, "a") as fh:
        fh.write('{"timestamp": 10000, "input_length": -1, "output_length": 1, "hash_ids": [0]}\n')
        fh.write('{"timestamp": 11000, "input_le\n')
    out_path = tmp_path / "out" / "mc.parquet"
    code, out, err = run_cli(["import", "mooncake", str(src), "-o", str(out_path)], monkeypatch, capsys)
    assert code == 0, err
    assert "2 bad row(s) quarantined" in out and "runs" in out
    rejected = [
        orjson.loads(x) for x in (out_path.parent / "mc.parquet.rejected.jsonl").read_bytes().splitlines()
    ]
    assert [r["row"] for r in rejected] == [5, 6]
    steps = read_records(out_path, strict=True).frame
    assert (steps["record"] == "step").sum() == 4
    code, out, err = run_cli(
        ["import", "mooncake", str(src), "-o", str(tmp_path / "s.parquet"), "--strict"], monkeypatch, capsys
    )
    assert code == 2 and "trace.jsonl:5: negative 'input_length'" in _one_line(err)
    assert not (tmp_path / "s.parquet").exists()


def test_import_with_pairing_flags(tmp_path, monkeypatch, capsys):
    d = tmp_path / "swe"
    d.mkdir()
    (d / "eval_results__small.json").write_text(json.dumps({"i1": False, "i2": True}))
    (d / "eval_results__big.json").write_text(json.dumps({"i1": True, "i2": True}))
    out_path = tmp_path / "swe.parquet"
    code, out, err = run_cli(
        ["import", "swebench-pro", str(d), "-o", str(out_path), "--weak", "small", "--strong", "big"],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    runs = read_records(out_path, strict=True).frame.set_index("run_id")
    assert runs.loc["swebench-pro-small-i1", "pair_label"] == "needs_frontier"
    assert bool(runs.loc["swebench-pro-small-i1", "needs_frontier"]) is True
    assert runs.loc["swebench-pro-small-i2", "pair_label"] == "weak_ok"
    code, out, err = run_cli(
        ["import", "swebench-pro", str(d), "-o", str(out_path), "--weak", "small"], monkeypatch, capsys
    )
    assert code == 2 and "--weak and --strong go together" in _one_line(err)


def test_unknown_source(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(
        ["import", "nosuch", str(_trace(tmp_path)), "-o", str(tmp_path / "o.parquet")], monkeypatch, capsys
    )
    assert code == 2 and "unknown source 'nosuch'" in _one_line(err)


def test_console_script_prints_no_traceback(tmp_path):
    """End to end through a real process: one line on stderr, exit code 2."""
    proc = subprocess.run(
        [sys.executable, "-m", "runroute", "summarize", str(tmp_path / "missing.parquet")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert _one_line(proc.stderr).startswith("runroute: error:")
