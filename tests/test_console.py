"""What a person running `hpt run` sees (issue 15): progress lines from the coordinate check, the
sweep and the large run; none of the library noise on the console, all of it in the study's log
file; everything back with `--verbose`. The slow tests read the session's one real run of a tiny
spec in a fresh process (`hpt_run_study` in conftest.py); the `--verbose` re-run of a copy of that
study (it resumes: the sweep keeps its trials, the large run its final checkpoint) is the local
launcher's real run in test_launchers.py. The fast ones check the pieces: the routing of Ray worker output, the
driver's tail of rank 0's progress, the progress lines and the batched MLflow writes."""

import json
import logging
import re
import threading
import time

import pytest
from typer.testing import CliRunner

from hptransfer import logs
from hptransfer.cli import app
from hptransfer.study import TrainPaths
from hptransfer.tracking import BatchedMetrics
from hptransfer.train.progress import Progress

from conftest import E2E_COORD_WIDTHS, E2E_EVAL_EVERY, E2E_STEPS

STEPS, EVAL, CC = E2E_STEPS, E2E_EVAL_EVERY, E2E_COORD_WIDTHS  # the shared study's large run, coord check
# Printed during every large run (Ray Train, DeepSpeed, torch): off the console, in the log file.
NOISE = [
    "TrainingReport(",
    "deepspeed_shm_comm_op built",
    "Setting accelerator to CPU",
    "FutureWarning",
    "(RayTrainWorker pid=",
    "(TrainController pid=",
]
# Printed on some machines only (e.g. several Ray instances on one host): never on the console.
SOMETIMES = ["PlacementGroupCleaner", "Failed to query Ray Train Controller actor state", "Token authentication"]
PROGRESS = re.compile(r"^train step (\d+)/(\d+)  loss \d+\.\d{4}(  val \d+\.\d{4})?  tok/s \d+  ETA \S+$", re.M)


@pytest.fixture
def study(hpt_run_study):
    return hpt_run_study


@pytest.mark.slow
def test_progress_lines_reach_the_console(study):
    console = study["console"]
    lines = {int(m.group(1)): m.group(0) for m in PROGRESS.finditer(console)}
    assert set(lines) == set(range(1, STEPS + 1)), console[-3000:]  # ≥ every 10% of the steps: here every step
    assert all(m.group(2) == str(STEPS) for m in PROGRESS.finditer(console))
    assert "  val " in lines[EVAL] and "  val " in lines[STEPS] and "  val " not in lines[EVAL - 1]  # val when evaluated
    assert all(f"coord check {i}/{len(CC)}: width {w}" in console for i, w in enumerate(CC, 1)), console[-3000:]
    assert "[sweep 6/6]" in console
    assert "\x1b[" not in console  # plain text in a CI log


@pytest.mark.slow
def test_library_noise_goes_to_the_log_file_only(study):
    console, log = study["console"], study["log"]
    for noise in NOISE + SOMETIMES:
        assert noise not in console, f"{noise!r} on the console:\n{console[-3000:]}"
    for noise in NOISE:
        assert noise in log, f"{noise!r} missing from hpt.log"
    assert f"train step {STEPS}/{STEPS}" in log  # our own lines are in the log file too, for context
    assert "\x1b[" not in log


@pytest.mark.slow
def test_progress_json_and_status_of_the_finished_study(study):
    progress = json.loads((study["dir"] / "train" / "progress.json").read_text())
    assert progress["step"] == progress["total"] == STEPS and progress["status"] == "ok"
    assert progress["eta_s"] == 0 and progress["tokens_per_s"] > 0 and progress["time"] > progress["started"]
    r = CliRunner().invoke(app, ["status", str(study["dir"]), "--json"])  # in process: no second start-up
    assert r.exit_code == 0, r.output
    st = json.loads(r.stdout)
    states = {k: v["state"] for k, v in st["stages"].items()}
    assert states == {"spec": "done", "coord_check": "pass", "sweep": "done", "plan": "done", "train": "done", "report": "done"}
    assert st["stages"]["sweep"]["by_status"] == {"ok": 6}
    assert st["stages"]["train"]["final"]["step"] == STEPS
    kinds = sorted(r["kind"] for r in st["mlflow"]["runs"])
    assert kinds == ["sweep", "train"] and st["mlflow"]["runs_by_kind"]["trial"] == 6
    assert st["mlflow"]["tracking_uri"] == f"sqlite:///{study['dir'] / 'mlflow.db'}"


# `--verbose` brings the noise back: end to end, Ray's driver lines on test_launchers.py's
# `hpt --verbose run` through launchers/local.py, Ray Train's workers' lines on test_dp_finetune.py's;
# the routing of each kind of line (DeepSpeed's included) is tested below, fast.


# --- the pieces, fast -----------------------------------------------------------------------------


@pytest.fixture
def log_file(tmp_path):
    path = logs.attach(tmp_path / "hpt.log")
    yield path
    logs.set_verbose(False)


def test_worker_output_goes_to_the_log_file_and_to_the_console_only_when_verbose(log_file, capsys):
    noise = {
        "pid": 4242,
        "actor_name": "RayTrainWorker",
        "is_err": True,
        "lines": ["\x1b[36mDeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully\x1b[0m"],
    }
    logs.route_worker_output(noise)
    logs.route_worker_output({"pid": "raylet", "is_err": True, "lines": ["A worker died or was killed"]})
    out = capsys.readouterr()
    assert "deepspeed_shm_comm_op" not in out.out + out.err
    assert "(raylet) A worker died or was killed" in out.err  # the raylet's lines stay on the console
    logs.set_verbose(True)
    logs.route_worker_output(noise)
    out = capsys.readouterr()
    assert "(RayTrainWorker pid=4242) DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully\n" in out.err
    for handler in logging.getLogger("hpt.workers").handlers:
        handler.flush()
    text = log_file.read_text()
    assert text.count("(RayTrainWorker pid=4242) DeepSpeed deepspeed.ops.comm") == 2 and "\x1b[" not in text
    logs.route_worker_output({"pid": 1, "lines": None})  # a malformed batch must not raise on Ray's log thread


def test_follow_prints_every_appended_line_in_order(tmp_path):
    path = tmp_path / "progress.log"
    path.write_text("a line from a previous session\n")
    seen: list[str] = []

    def rank0():
        for i in range(200):  # faster than the tail's poll: nothing may be lost or reordered
            with path.open("a") as f:
                f.write(f"train step {i + 1}/200\n")
        with path.open("a") as f:
            f.write("half a li")  # an unfinished line waits for its end

    with logs.follow(path, seen.append, every_s=0.01):
        t = threading.Thread(target=rank0)
        t.start()
        time.sleep(0.05)
        t.join()
    assert seen == [f"train step {i + 1}/200" for i in range(200)]


def test_progress_lines_at_least_every_tenth_and_at_each_evaluation(tmp_path):
    paths = TrainPaths(tmp_path)
    p = Progress(paths, total=95, start=0)
    for step in range(1, 96):
        m = {"step": step, "train_loss": 2.0, "tokens_per_s": 1000.0, **({"val_loss": 2.5} if step % 25 == 0 else {})}
        p.step(m)
    p.finish({"step": 95, "status": "ok"})
    lines = paths.progress_log.read_text().splitlines()
    steps = [int(re.match(r"train step (\d+)/95", ln).group(1)) for ln in lines]
    assert steps == sorted({1, *range(9, 96, 9), 25, 50, 75, 95})
    assert all(b - a <= 95 // 10 for a, b in zip([0, *steps], steps))  # at least every 10% of the steps
    assert "val 2.5000" in lines[steps.index(25)] and "val" not in lines[steps.index(27)]
    state = json.loads(paths.progress.read_text())
    assert state["step"] == state["total"] == 95 and state["status"] == "ok" and state["val_step"] == 75
    assert Progress(TrainPaths(tmp_path / "rank1"), total=95, start=0, enabled=False).step({"step": 1}) is None
    assert not (tmp_path / "rank1").exists()  # other ranks write nothing


class _Recorder:
    def __init__(self):
        self.writes = []

    def log_metric_rows(self, rows):
        self.writes.append(list(rows))


def test_batched_metrics_write_every_step_in_few_calls():
    by_steps = BatchedMetrics(_Recorder(), every_steps=4)
    by_time = BatchedMetrics(_Recorder(), every_s=3600)
    for tracker in (by_steps, by_time):
        for step in range(1, 11):
            tracker.log_metrics({"train_loss": 1.0 / step}, step=step)
        tracker.flush()
        tracker.flush()  # nothing left: no empty write
        rows = [r for w in tracker.tracker.writes for r in w]
        assert [step for _, step, _ in rows] == list(range(1, 11)) and tracker.writes == len(tracker.tracker.writes)
    assert [len(w) for w in by_steps.tracker.writes] == [4, 4, 2]
    assert [len(w) for w in by_time.tracker.writes] == [10]  # within the interval: one write at the end
    per_call = BatchedMetrics(_Recorder(), every_s=0)
    per_call.log_metrics({"x": 1}, step=1)
    assert per_call.writes == 1
