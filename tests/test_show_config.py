"""`--config FILE` / `--show-config` on every command that acts for a deployment (issue 23).

A what-if of a config answers for exactly the deployment that config serves: the file's prices,
GPU price, SLOs, KV size and replicas/profile; a command-line flag overrides the file and
``--show-config`` says so; a RUNROUTE_* variable overrides the file as it does for ``serve``; a
bad file exits 2 with one line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

COMMANDS = ["serve", "whatif", "bench", "replay", "evaluate", "train", "loop", "demo"]

DEPLOYMENT = """\
local:
  urls: [http://10.0.0.5:8000, http://10.0.0.6:8000, http://10.0.0.7:8000]
  gpu_usd_per_hour: 3.25
frontier:
  url: http://127.0.0.1:9
  allow_no_key: true
  price_in_per_m: 3.0
  price_cached_in_per_m: 0.3
  price_out_per_m: 15.0
  price_cache_write_per_m: 3.75
node:
  gpu: h100
  kv_cache_gb: 24.0
slo:
  ttft_s: 4.5
admission:
  slo_short_step_s: 1.5
policy: session-sticky
"""


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    from runroute.cli import app

    monkeypatch.setattr(sys, "argv", ["runroute", *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as e:
        app()
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def _shown(out: str) -> dict[str, tuple[str, str]]:
    """``--show-config`` lines as ``key -> (value, source)``."""
    rows = {}
    for line in out.splitlines()[1:]:
        key, value, source = line.split(maxsplit=2)
        rows[key] = (value, source)
    return rows


@pytest.fixture
def deployment(tmp_path, monkeypatch) -> Path:
    for k in list(__import__("os").environ):
        if k.upper().startswith("RUNROUTE_"):
            monkeypatch.delenv(k)
    f = tmp_path / "runroute.yaml"
    f.write_text(DEPLOYMENT)
    return f


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_shows_the_files_deployment_with_sources(command, deployment, monkeypatch, capsys):
    rc, out, err = run_cli([command, "--config", str(deployment), "--show-config"], monkeypatch, capsys)
    assert rc == 0, err
    rows = _shown(out)
    src = f"file {deployment}"
    assert rows["frontier.price_in_per_m"] == ("3", f"{src} (frontier.price_in_per_m)")
    assert rows["frontier.price_cached_in_per_m"] == ("0.3", f"{src} (frontier.price_cached_in_per_m)")
    assert rows["frontier.price_out_per_m"] == ("15", f"{src} (frontier.price_out_per_m)")
    assert rows["frontier.price_cache_write_per_m"] == ("3.75", f"{src} (frontier.price_cache_write_per_m)")
    assert rows["gpu_hour_usd"] == ("3.25", f"{src} (local.gpu_usd_per_hour)")
    assert rows["replicas"] == ("3", f"{src} (local.urls)")
    assert rows["node.gpu"] == ("h100", f"{src} (node.gpu)")
    assert rows["node.kv_cache_gb"] == ("24", f"{src} (node.kv_cache_gb)")
    assert rows["slo.ttft_s"] == ("4.5", f"{src} (slo.ttft_s)")
    assert rows["admission.slo_short_step_s"] == ("1.5", f"{src} (admission.slo_short_step_s)")
    assert rows["slo.step_latency_s"][1] == "default"
    assert rows["admission.enabled"] == ("True", "default")


def test_without_a_config_every_value_is_a_default(monkeypatch, capsys):
    from router.policy import defaults as d

    for k in list(__import__("os").environ):
        if k.upper().startswith("RUNROUTE_"):
            monkeypatch.delenv(k)
    rc, out, _ = run_cli(["whatif", "--show-config"], monkeypatch, capsys)
    assert rc == 0
    rows = _shown(out)
    assert {src for _, src in rows.values()} == {"default"}
    assert float(rows["gpu_hour_usd"][0]) == d.GPU_HOUR_USD
    assert float(rows["slo.ttft_s"][0]) == d.SLO_TTFT_S
    assert float(rows["slo.step_latency_s"][0]) == d.SLO_STEP_S


def test_a_flag_overrides_the_file_and_show_config_says_so(deployment, monkeypatch, capsys):
    args = ["whatif", "--config", str(deployment), "--gpu-hour-usd", "1.1", "--slo-ttft-s", "9"]
    rc, out, err = run_cli(
        [*args, "--frontier-price", "1,0.1,4", "--kv-cache-gb", "40", "--show-config"], monkeypatch, capsys
    )
    assert rc == 0, err
    rows = _shown(out)
    assert rows["gpu_hour_usd"] == ("1.1", "flag --gpu-hour-usd")
    assert rows["slo.ttft_s"] == ("9", "flag --slo-ttft-s")
    assert rows["frontier.price_out_per_m"] == ("4", "flag --frontier-price")
    assert rows["node.kv_cache_gb"] == ("40", "flag --kv-cache-gb")
    assert rows["admission.slo_short_step_s"][1].startswith("file ")  # not given: still the file's


def test_env_overrides_the_file_as_for_serve(deployment, monkeypatch, capsys):
    monkeypatch.setenv("RUNROUTE_SLO__TTFT_S", "6.5")
    monkeypatch.setenv("RUNROUTE_ADMISSION__ENABLED", "false")
    rc, out, _ = run_cli(["bench", "--config", str(deployment), "--show-config"], monkeypatch, capsys)
    assert rc == 0
    rows = _shown(out)
    assert rows["slo.ttft_s"] == ("6.5", "env RUNROUTE_SLO__TTFT_S")
    assert rows["admission.enabled"] == ("False", "env RUNROUTE_ADMISSION__ENABLED")


def test_the_default_frontier_of_several_is_the_billed_one(tmp_path, monkeypatch, capsys):
    f = tmp_path / "two.yaml"
    f.write_text(
        "frontiers:\n"
        "  - {name: a, url: http://127.0.0.1:9, allow_no_key: true, price_in_per_m: 1.0}\n"
        "  - {name: b, url: http://127.0.0.1:9, allow_no_key: true, price_in_per_m: 7.0, default: true}\n"
    )
    rc, out, _ = run_cli(["whatif", "--config", str(f), "--show-config"], monkeypatch, capsys)
    assert rc == 0
    assert _shown(out)["frontier.price_in_per_m"] == ("7", f"file {f} (frontiers[1].price_in_per_m)")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "config file not found"),
        ("local: [unclosed\n", "not valid YAML"),
        ("- a list\n", "top level must be a mapping"),
        ("node:\n  kv_cache_gb: -1\n", "node.kv_cache_gb"),
        ("slo:\n  ttft_s: soon\n", "slo.ttft_s"),
        ("node:\n  kv_gb: 16\n", "node.kv_gb"),
    ],
)
@pytest.mark.parametrize("command", ["whatif", "serve"])
def test_a_bad_file_exits_2_with_one_line(command, text, says, tmp_path, monkeypatch, capsys):
    f = tmp_path / "bad.yaml"
    if text is not None:
        f.write_text(text)
    rc, out, err = run_cli([command, "--config", str(f), "--show-config"], monkeypatch, capsys)
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and says in lines[0] and "Traceback" not in err, (rc, err)


def test_whatif_of_a_config_simulates_that_deployment(deployment, tmp_path, monkeypatch, capsys):
    """Not only shown: the simulation runs at the file's prices, GPU price, SLOs, KV size, replicas
    and node profile (h100), and a flag still wins."""
    from features.samples import samples_dir

    out = tmp_path / "w.json"
    args = ["whatif", "--config", str(deployment), "--runs", str(samples_dir() / "tau2bench_airline.parquet")]
    args += ["--policy", "always-local", "--limit-runs", "4", "--boot", "0", "--no-kv-double"]
    rc, _, err = run_cli([*args, "--slo-short-s", "1.75", "--json", str(out)], monkeypatch, capsys)
    assert rc == 0, err
    inputs = json.loads(out.read_text())["inputs"]
    assert inputs["gpu_hour_usd"] == 3.25
    assert (inputs["frontier"]["price_in_per_m"], inputs["frontier"]["price_cached_in_per_m"]) == (3.0, 0.3)
    assert inputs["frontier"]["price_out_per_m"] == 15.0
    assert inputs["kv_cache_gb"] == [24.0]
    assert inputs["replicas"] == [3]
    assert inputs["node_profile"].startswith("h100")
    assert inputs["slo_ttft_s"] == 4.5
    assert inputs["slo_short_s"] == 1.75  # the flag over the file's 1.5
    assert inputs["admission"] is True  # the sidecar admits by default; so does its what-if


def test_whatif_slo_targets_set_the_per_step_slos_over_the_file(deployment, monkeypatch, capsys):
    args = ["whatif", "--config", str(deployment), "--slo", "short_p95=1.2s,ttft_p95=3s", "--show-config"]
    rc, out, _ = run_cli(args, monkeypatch, capsys)
    assert rc == 0
    rows = _shown(out)
    assert rows["admission.slo_short_step_s"] == ("1.2", "flag --slo short_p95")
    assert rows["slo.ttft_s"] == ("3", "flag --slo ttft_p95")


def test_the_admission_knobs_a_file_states_reach_whatifs_controller(tmp_path, monkeypatch):
    from runroute.deployconfig import resolve

    for k in list(__import__("os").environ):
        if k.upper().startswith("RUNROUTE_"):
            monkeypatch.delenv(k)
    f = tmp_path / "adm.yaml"
    f.write_text(
        "admission:\n  replica_slots: 8\n  headroom: {interactive: 0.8, batch: 0.5}\n  slo_short_step_s: 1.5\n"
    )
    r = resolve(f)
    stated = r.stated_fields("admission", exclude={"slo_short_step_s"})
    assert set(stated) == {"replica_slots", "headroom"}
    assert stated == {"replica_slots": 8, "headroom": {"interactive": 0.8, "batch": 0.5}}
    assert r.stated_fields("slo") == {}
