"""MLflow down when a stage *starts* (issue 39, item 5): the large run starts anyway, its run is
created once the server answers and gets everything, in order; the sweep's and the plan's records
are said to be pending, not a failed stage. Against a real `mlflow server` started late on the very
port that refused the first writes."""

from __future__ import annotations

import json

import pytest

from hptransfer.context import StudyContext
from hptransfer.pipeline import _log_plan
from hptransfer.plan import load_plan
from hptransfer.tracking import PENDING, ids_file, mlflow_or_later, read_unsent, replay_unsent
from hptransfer.train.runner import train_tracker

from conftest import free_port, start_mlflow_server, stop_process

PLAN = load_plan("tests/data/old_plans/hpt_run_console.yaml")


def test_a_large_run_started_while_mlflow_is_down_is_created_and_filled_when_it_answers(tmp_path):
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    ctx = StudyContext(None, tmp_path / "study", name="console", tracking_uri=uri)
    said: list[str] = []
    tracker = train_tracker(ctx, PLAN, tags={"rule": PLAN.rule}, params={"target_width": 64}, log=said.append)
    assert tracker.run_id.startswith(PENDING)
    assert any("unreachable" in s and "training starts anyway" in s for s in said), said
    recorded = json.loads(ctx.paths.train.mlflow_run.read_text())
    assert recorded["run_id"] == tracker.run_id and recorded["pending"]
    # What a large run writes (rank 0 and the driver share the spool): steps, tags, the end.
    tracker.log_metric_rows([({"loss": 3.0 - 0.1 * s}, s, 1_000 + s) for s in range(1, 6)])
    tracker.set_tags({"hpt.checkpoint_step": 5})
    tracker.end("FINISHED")
    ops = read_unsent(ctx.paths.train.mlflow_unsent)
    assert [op["op"] for op in ops] == ["create", "params", "metrics", "tags", "end"]

    server = start_mlflow_server(tmp_path, port)  # MLflow comes up on the same address
    try:
        assert replay_unsent(ctx.paths.train.mlflow_unsent, uri)
        real = json.loads(ids_file(ctx.paths.train.mlflow_unsent).read_text())[tracker.run_id]
        from mlflow import MlflowClient

        c = MlflowClient(uri)
        run = c.get_run(real)
        assert run.info.run_name == "console-train" and run.info.status == "FINISHED"
        assert run.data.tags["hpt.kind"] == "train" and run.data.tags["hpt.study_dir"] == str(ctx.root)
        assert run.data.params["target_width"] == "64" and run.data.tags["hpt.checkpoint_step"] == "5"
        losses = sorted((m.step, m.value) for m in c.get_metric_history(real, "loss"))
        assert losses == [(s, pytest.approx(3.0 - 0.1 * s, abs=1e-9)) for s in range(1, 6)]
        assert not ctx.paths.train.mlflow_unsent.exists()

        # A resume of the same large run continues that run, not a second one.
        again = train_tracker(ctx, PLAN, tags={"rule": PLAN.rule}, params={"target_width": 64}, log=said.append)
        assert again.run_id == real and json.loads(ctx.paths.train.mlflow_run.read_text())["run_id"] == real
        assert c.get_run(real).info.status == "RUNNING"
        assert len(c.search_runs([run.info.experiment_id])) == 1
    finally:
        stop_process(server)


def test_the_sweep_and_plan_records_wait_for_mlflow_instead_of_failing_the_stage(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    ctx = StudyContext(None, tmp_path, name="console", tracking_uri=uri)
    said: list[str] = []
    assert mlflow_or_later(ctx, "the plan", lambda: _log_plan(ctx, PLAN, tmp_path / "plan.yaml"), said.append) is None
    assert len(said) == 1 and "unreachable" in said[0] and "the plan not logged" in said[0], said

    def bug():
        raise ValueError("not an outage")

    with pytest.raises(ValueError):  # anything else is still an error
        mlflow_or_later(ctx, "the plan", bug, said.append)
