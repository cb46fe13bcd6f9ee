"""Faults a cluster really has, on real processes, in ONE large run that meets them in turn (each
outcome asserted on its own): `hpt train` SIGTERMed (preemption), resumed and SIGKILLed with its
Ray (a lost head pod), its newest checkpoints torn, resumed again while the real `mlflow server` it
logs to is stopped, then the server restarted and the unsent records delivered. The run is the
shared `hpt run` study's plan (conftest `hpt_run_study`) with a checkpoint every step, so it must end
where that study's uninterrupted large run ended; MLflow must hold one large run, FINISHED, with
every step. The fast half (torn files, a full disk, the spool) is tests/test_faults.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import free_port, start_mlflow_server, stop_process

pytestmark = pytest.mark.slow


def _wait_for(predicate, what: str, timeout: float = 300, proc: subprocess.Popen | None = None) -> None:
    """Poll `predicate`; fail at the deadline, or at once (with its output) when `proc` has exited."""
    deadline = time.time() + timeout
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"the process exited ({proc.returncode}) before {what}:\n{out[-4000:]}")
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _train_runs(uri: str, experiment: str):
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], filter_string="tags.`hpt.kind` = 'train'")


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def test_preempted_killed_torn_and_untracked_large_run_ends_where_an_uninterrupted_one_ends(hpt_run_study, tmp_path):
    from hptransfer.status import describe, replay_mlflow, study_status

    ref = json.loads((hpt_run_study["dir"] / "train" / "train_metrics.json").read_text())["final"]
    plan = yaml.safe_load((hpt_run_study["dir"] / "transfer_plan.yaml").read_text())
    steps = plan["target"]["steps"]
    # Same model, data and schedule; a checkpoint every step (3 kept), one at every stop, no restarts.
    plan["train"].update(checkpoint_every=1, keep_checkpoints=3, stop_checkpoint_after_s=0, max_failures=0)
    study = tmp_path / "study"
    study.mkdir()
    plan_path = study / "transfer_plan.yaml"
    plan_path.write_text(yaml.safe_dump(plan, sort_keys=False))
    server_root = tmp_path / "mlflow"
    server_root.mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_mlflow_server(server_root, port)
    train = study / "train"
    cmd = [sys.executable, "-m", "hptransfer", "train", str(plan_path), "--study-dir", str(study), "--tracking-uri", uri]
    figures: dict = {}
    try:
        # 1. Preemption: SIGTERM to the driver once its workers run. They stop at the next step
        #    boundary with a checkpoint; exit 75; the MLflow run is KILLED, tagged with the step.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        _wait_for(lambda: (train / "pids" / "rank0").exists(), "the workers of run 1", proc=p)
        p.send_signal(signal.SIGTERM)
        t = time.time()
        out1, _ = p.communicate(timeout=300)
        figures["sigterm_to_exit_s"] = round(time.time() - t, 1)
        assert p.returncode == 75, out1[-4000:]
        assert "stopped: the large run stopped at step" in out1 and "--resume" in out1, out1[-3000:]
        assert "Traceback" not in out1
        stopped = _json(train / "progress.json")
        assert stopped["status"] == "preempted" and stopped["checkpoint_step"] == stopped["step"] >= 1
        assert 0 < stopped["step"] < steps
        client, runs = _train_runs(uri, plan["study"])
        assert [(r.info.status, r.data.tags["hpt.preempted_at_step"]) for r in runs] == [("KILLED", str(stopped["step"]))]
        run_id = runs[0].info.run_id
        st = study_status(study, mlflow=False)
        assert st["stages"]["train"]["state"] == "preempted", st["stages"]["train"]

        # 2. The driver and its Ray SIGKILLed (a lost head pod) two checkpoints into the resumed run.
        p = subprocess.Popen(
            [*cmd, "--resume"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        t = time.time()
        _wait_for(
            lambda: _json(train / "progress.json").get("checkpoint_step", 0) >= stopped["step"] + 2, "run 2's checkpoints", proc=p
        )
        figures["resume_to_second_checkpoint_s"] = round(time.time() - t, 1)
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        killed_at = _json(train / "progress.json")["step"]
        assert killed_at < steps, "run 2 finished before it was killed"
        client, runs = _train_runs(uri, plan["study"])
        assert [(r.info.run_id, r.info.status) for r in runs] == [(run_id, "RUNNING")]  # one run, continued

        # 3. Torn checkpoints: every one but the oldest (run 1's) cut short, as a crash on a
        #    filesystem without atomic rename leaves them. (Some may be newer than the one Ray Train
        #    registered last: a kill mid-copy leaves such folders, and the resume never looks at them.)
        kept = sorted(p for p in (train / "ray_results" / "train").glob("checkpoint_*") if p.is_dir())
        assert len(kept) >= 3, kept  # run 1's and at least two of run 2's
        for folder in kept[1:]:
            biggest = max(
                (f for f in folder.rglob("*") if f.is_file() and f.name != "hpt_manifest.json"), key=lambda f: f.stat().st_size
            )
            os.truncate(biggest, biggest.stat().st_size // 2)
        good_step = json.loads((kept[0] / "hpt_manifest.json").read_text())  # (whole)
        assert good_step["bytes"] > 0

        # 4. Resumed again; the MLflow server is stopped once the run has reopened its MLflow run and
        #    stays down to the end: training goes on, what MLflow did not take waits in the study.
        downed: list[float] = []

        def stop_server_when_training():
            _wait_for(lambda: "torn" in (train / "progress.log").read_text(), "run 3's torn-checkpoint lines")
            stop_process(server)
            downed.append(time.time())

        watcher = threading.Thread(target=stop_server_when_training, daemon=True)
        watcher.start()
        t = time.time()
        r = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=600)
        figures["run3_s"] = round(time.time() - t, 1)
        watcher.join(30)
        out3 = r.stdout + r.stderr
        assert r.returncode == 0, out3[-4000:]
        assert downed, "the server was not stopped"
        assert "torn (cut short while written), skipped" in out3, out3[-3000:]
        assert f"train: resuming from the previous whole checkpoint, {kept[0].name}" in out3, out3[-3000:]
        final = json.loads((train / "train_metrics.json").read_text())["final"]
        figures.update(
            preempted_at=stopped["step"],
            killed_at=killed_at,
            resumed_from=final["resumed_from_step"],
            train_loss=final["train_loss"],
            val_loss=final["val_loss"],
            ref_train_loss=ref["train_loss"],
            ref_val_loss=ref["val_loss"],
        )
        print("FAULT FIGURES", json.dumps(figures))
        assert final["status"] == "ok" and final["step"] == steps
        assert final["resumed_from_step"] == stopped["step"]  # run 1's checkpoint, the one left whole
        # Ends where the uninterrupted run ended (the kill-a-worker test's tolerance).
        assert final["train_loss"] == pytest.approx(ref["train_loss"], rel=1e-3)
        assert final["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-3)
        lines = "\n".join(describe(study_status(study, tracking_uri=uri)))
        assert "NOT LOGGED (MLflow was unreachable): " in lines and "the run's end (FINISHED)" in lines, lines
        assert f"hpt status {study} --replay-mlflow" in lines

        # 5. The server back: the replay delivers everything; one large run, FINISHED, every step.
        server = start_mlflow_server(server_root, port)
        assert replay_mlflow(study, tracking_uri=uri).startswith("MLflow: delivered ")
        assert not (train / "mlflow_unsent.jsonl").exists()
        client, runs = _train_runs(uri, plan["study"])
        assert [(r.info.run_id, r.info.status) for r in runs] == [(run_id, "FINISHED")]
        assert {m.step for m in client.get_metric_history(run_id, "train_loss")} == set(range(1, steps + 1))
        assert runs[0].data.metrics["final_val_loss"] == pytest.approx(final["val_loss"])
        assert "train_metrics.json" in {a.path for a in client.list_artifacts(run_id)}
    finally:
        stop_process(server)
