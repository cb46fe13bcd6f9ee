"""`--restart` of a large run (issue 39, the last faults): the replaced run's files move aside and
its MLflow run — left RUNNING by a killed driver — is ended KILLED and tagged with where its files
went; a run that had finished keeps its status; MLflow down does not stop the restart. A real
MLflow store (the study's SQLite file), the real `prepare_train_dir`."""

from __future__ import annotations

from pathlib import Path

import pytest

from hptransfer.context import StudyContext
from hptransfer.io import write_json
from hptransfer.train.runner import prepare_train_dir


def _study_with_a_large_run(root: Path, tracking_uri: str | None = None, *, finished: bool = False) -> tuple[StudyContext, str]:
    """A study whose train/ holds a large run (its Ray Train folder) and the MLflow run it logged to,
    RUNNING as a SIGKILLed driver leaves it (or FINISHED)."""
    ctx = StudyContext(None, root, name="restart-test", tracking_uri=tracking_uri)
    paths = ctx.paths.train
    paths.ray_experiment.mkdir(parents=True)
    (paths.ray_experiment / "checkpoint_000001").mkdir()
    run_id = "not-logged"
    if tracking_uri is None:
        tracker = ctx.tracker("restart-test-train", kind="train")
        run_id = tracker.run_id
        if finished:
            from mlflow import MlflowClient

            MlflowClient(ctx.tracking_uri).set_terminated(run_id, status="FINISHED")
    write_json(paths.mlflow_run, {"run_id": run_id, "tracking_uri": ctx.tracking_uri})
    return ctx, run_id


def _run(ctx: StudyContext, run_id: str):
    from mlflow import MlflowClient

    return MlflowClient(ctx.tracking_uri).get_run(run_id)


def test_restart_ends_the_replaced_running_mlflow_run_killed_and_tagged(tmp_path):
    ctx, run_id = _study_with_a_large_run(tmp_path)
    assert _run(ctx, run_id).info.status == "RUNNING"
    lines: list[str] = []
    assert prepare_train_dir(ctx, None, resume=False, restart=True, log=lines.append) is False
    run = _run(ctx, run_id)
    assert run.info.status == "KILLED" and run.info.end_time is not None
    aside = next((ctx.paths.replaced).iterdir())
    assert run.data.tags["hpt.replaced"] == f"--restart moved its files to {aside}"
    assert (aside / "train" / "mlflow_run.json").is_file() and not ctx.paths.train.mlflow_run.exists()
    assert not ctx.paths.train.ray_experiment.exists()
    assert any(f"the replaced run {run_id} was still RUNNING: ended KILLED" in ln for ln in lines), lines


def test_restart_keeps_a_finished_runs_status_and_tags_it(tmp_path):
    ctx, run_id = _study_with_a_large_run(tmp_path, finished=True)
    lines: list[str] = []
    prepare_train_dir(ctx, None, resume=False, restart=True, log=lines.append)
    run = _run(ctx, run_id)
    assert run.info.status == "FINISHED" and run.data.tags["hpt.replaced"].startswith("--restart moved its files to ")
    assert not any("ended KILLED" in ln for ln in lines), lines


def test_restart_goes_on_when_mlflow_is_unreachable_and_says_so(tmp_path):
    from conftest import free_port

    ctx, run_id = _study_with_a_large_run(tmp_path, tracking_uri=f"http://127.0.0.1:{free_port()}")
    lines: list[str] = []
    prepare_train_dir(ctx, None, resume=False, restart=True, log=lines.append)
    assert not ctx.paths.train.ray_experiment.exists()  # the files moved aside all the same
    assert any(f"MLflow: could not close the replaced run {run_id}" in ln and "left as it was" in ln for ln in lines), lines


def test_plain_rerun_over_a_run_is_still_refused(tmp_path):
    from hptransfer.errors import PlanError

    ctx, run_id = _study_with_a_large_run(tmp_path)
    with pytest.raises(PlanError, match="--resume to continue it .* or --restart to discard it"):
        prepare_train_dir(ctx, None, resume=False, restart=False)
    assert _run(ctx, run_id).info.status == "RUNNING"
