"""Run-log schema: pydantic models and the Arrow schema agree; validators refuse impossible rows."""

import pytest
from pydantic import ValidationError

from features.schema import ARROW_SCHEMA, RECORD_MODELS, SCHEMA_VERSION, Run, Step


def test_every_model_field_has_an_arrow_column():
    for model in RECORD_MODELS.values():
        assert set(model.model_fields) <= set(ARROW_SCHEMA.names)


def test_step_refuses_cached_above_prompt():
    with pytest.raises(ValidationError, match="cached_tokens"):
        Step(run_id="r", step=0, prompt_tokens=10, cached_tokens=11, completion_tokens=1)


def test_step_refuses_negative_tokens_and_unknown_fields():
    with pytest.raises(ValidationError):
        Step(run_id="r", step=0, prompt_tokens=-1, completion_tokens=1)
    with pytest.raises(ValidationError):
        Step(run_id="r", step=0, prompt_tokens=1, completion_tokens=1, prompt="secret")  # type: ignore[call-arg]


def test_run_refuses_end_before_start_and_carries_version():
    with pytest.raises(ValidationError, match="ended_at"):
        Run(run_id="r", source="x", started_at=10.0, ended_at=5.0)
    assert Run(run_id="r", source="x").schema_version == SCHEMA_VERSION


def test_prompt_text_is_off_by_default():
    s = Step(run_id="r", step=0, prompt_tokens=5, completion_tokens=1)
    assert s.prompt_text is None


def test_mixed_runs_and_steps_round_trip_through_parquet_with_all_null_nested(tmp_path):
    from features.runlog import read_records, write_records

    recs = [Run(run_id="r", source="x"), Step(run_id="r", step=0, prompt_tokens=5, completion_tokens=1)]
    out = write_records(recs, tmp_path / "log.parquet")
    res = read_records(out, strict=True)
    assert len(res.frame) == 2 and not res.bad_rows
