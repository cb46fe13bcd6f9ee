"""`hpt status STUDY_DIR` on study folders in each state, built file by file (no Ray, no training):
finished, partial (spec + results only), a sweep running, a large run running, a large run
interrupted. The status of a folder a real `hpt run` made is checked in test_console.py."""

import json
import os
import re
import socket
import time

import pytest
import yaml
from typer.testing import CliRunner

from hptransfer.cli import app
from hptransfer.errors import StudyError
from hptransfer.io import write_json
from hptransfer.status import study_status
from hptransfer.study import SWEEP_EXPERIMENT, Study, StudyPaths

from conftest import tiny_spec_dict

SPEC = tiny_spec_dict(name="st", target={"width": 64, "steps": 10, "batch_size": 8})
N_TRIALS = 6  # 2 widths × 3 lr × 1 seed


def status(root, *args: str) -> tuple[str, dict]:
    runner = CliRunner()
    text = runner.invoke(app, ["status", str(root), *args])
    assert text.exit_code == 0, text.output
    as_json = runner.invoke(app, ["status", str(root), "--json", *args])
    assert as_json.exit_code == 0, as_json.output
    return text.output, json.loads(as_json.output)


def states(st: dict) -> dict:
    return {k: v["state"] for k, v in st["stages"].items()}


def spec_and_results(root):
    p = StudyPaths(root)
    root.mkdir(parents=True, exist_ok=True)
    p.spec.write_text(yaml.safe_dump(SPEC))
    rows = ["width,lr,seed,val_loss,status"] + [
        f"{w},{lr},0,{3 + lr},{'diverged' if lr == 0.3 and w == 32 else 'ok'}" for w in (16, 32) for lr in (0.003, 0.03, 0.3)
    ]
    p.sweep_results.write_text("\n".join(rows) + "\n")
    return p


def plan(p: StudyPaths):
    p.plan.write_text(
        yaml.safe_dump({"study": "st", "rule": "mup", "target": {"width": 64, "steps": 10}, "hyperparameters": {"lr": 0.0625}})
    )


def hold_lock(p: StudyPaths):
    """The study's lock as a live `hpt run` holds it (this test process stands in for it)."""
    write_json(p.lock, {"pid": os.getpid(), "host": socket.gethostname(), "started": "now", "command": "hpt run tiny.yaml"})


def progress(p: StudyPaths, step: int, **more):
    p.train.root.mkdir(parents=True, exist_ok=True)
    write_json(
        p.train.progress,
        {
            "step": step,
            "total": 10,
            "status": "running",
            "train_loss": 3.5,
            "tokens_per_s": 1500.0,
            "elapsed_s": 5.0,
            "eta_s": 5.0,
            "time": time.time(),
            **more,
        },
    )


def test_partial_study_spec_and_results_only(tmp_path):
    spec_and_results(tmp_path / "s")
    text, st = status(tmp_path / "s", "--no-mlflow")
    assert states(st) == {
        "spec": "done",
        "coord_check": "not run",
        "sweep": "done",
        "plan": "not run",
        "train": "not run",
        "report": "not run",
    }
    assert st["stages"]["sweep"]["by_status"] == {"ok": 5, "diverged": 1}
    assert st["stages"]["sweep"]["files"] == ["sweep_results.csv"]
    assert st["running"] is None and st["mlflow"]["tracking_uri"].endswith("/s/mlflow.db")
    assert "6 trials: 5 ok, 1 diverged" in text and "plan         not run" in text


def test_finished_study_lists_artifacts_metrics_and_mlflow_runs(tmp_path):
    root = tmp_path / "s"
    p = spec_and_results(root)
    write_json(
        p.coord_check_json,
        {"passed": True, "worst_slope": -0.12, "worst_module": "lm_head", "max_slope_allowed": 0.25, "widths": [16, 32]},
    )
    plan(p)
    progress(p, 10, status="ok", eta_s=0.0, val_loss=3.6, val_step=10)
    write_json(
        p.train.metrics,
        {"final": {"step": 10, "train_loss": 3.1, "val_loss": 3.6, "tokens_per_s": 1900.0, "status": "ok"}, "history": []},
    )
    p.report_html.parent.mkdir()
    p.report_html.write_text("<html></html>")
    study = Study.from_dir(root)
    sweep = study.tracker("st-sweep", kind="sweep")
    study.tracker("trial-0", kind="trial", parent_run_id=sweep.run_id).end()
    sweep.end()
    train = study.tracker("st-train", kind="train")
    train.end()

    text, st = status(root)
    assert states(st) == {
        "spec": "done",
        "coord_check": "pass",
        "sweep": "done",
        "plan": "done",
        "train": "done",
        "report": "done",
    }
    assert st["stages"]["train"]["final"] == {
        "step": 10,
        "train_loss": 3.1,
        "val_loss": 3.6,
        "tokens_per_s": 1900.0,
        "status": "ok",
    }
    assert st["stages"]["plan"]["hyperparameters"] == {"lr": 0.0625}
    assert st["stages"]["report"]["files"] == ["report/index.html"]
    m = st["mlflow"]
    assert m["experiment"] == "st" and m["runs_by_kind"] == {"sweep": 1, "trial": 1, "train": 1}
    assert {(r["kind"], r["run_id"], r["status"]) for r in m["runs"]} == {
        ("sweep", sweep.run_id, "FINISHED"),
        ("train", train.run_id, "FINISHED"),
    }
    assert sweep.run_id in text and train.run_id in text and "coord check  pass" in text


def test_sweep_running_counts_trials_from_tune_state_and_markers(tmp_path):
    root = tmp_path / "s"
    p = StudyPaths(root)
    root.mkdir()
    p.spec.write_text(yaml.safe_dump(SPEC))
    hold_lock(p)
    exp = p.experiment_dir(SWEEP_EXPERIMENT)
    exp.mkdir(parents=True)
    trials = ["TERMINATED", "TERMINATED", "RUNNING", "PENDING", "PENDING", "PENDING"]
    write_json(
        exp / "experiment_state-2026-01-01_00-00-00.json",
        {"trial_data": [[json.dumps({"trial_id": f"t{i}", "status": s}), "{}"] for i, s in enumerate(trials)]},
    )
    p.trials_done.mkdir()
    for i in range(3):  # a third trial finished after Tune's last snapshot
        write_json(p.trials_done / f"{i}.json", {"val_loss": 3.0})
    text, st = status(root, "--no-mlflow")
    sweep = st["stages"]["sweep"]
    assert sweep["state"] == "running" and sweep["finished"] == 3 and sweep["total"] == N_TRIALS
    assert sweep["tune_status"] == {"TERMINATED": 2, "RUNNING": 1, "PENDING": 3}
    assert st["running"]["pid"] == os.getpid() and "hpt run tiny.yaml" in text
    assert states(st)["plan"] == "not run"  # only the first unfinished stage is the running one


def test_large_run_running_shows_step_and_eta(tmp_path):
    p = spec_and_results(tmp_path / "s")
    plan(p)
    hold_lock(p)
    progress(p, 5, val_loss=3.7, val_step=5, eta_s=95.0, time=time.time() - 30)  # written 30 s ago
    text, st = status(tmp_path / "s", "--no-mlflow")
    train = st["stages"]["train"]
    assert train["state"] == "running" and train["progress"]["step"] == 5
    assert states(st)["coord_check"] == "not run" and states(st)["report"] == "not run"  # skipped, and not reached
    # The ETA is progress.json's eta_s less the file's age, however long this test took (no clock window).
    now = train["progress"]
    assert now["age_s"] >= 30 and now["eta_now_s"] == pytest.approx(95.0 - now["age_s"], abs=0.11)
    eta = re.search(r"ETA (?:(\d+)m)?(\d+)s", train["summary"])
    assert eta and abs(60 * int(eta[1] or 0) + int(eta[2]) - now["eta_now_s"]) <= 1, train["summary"]
    assert "step 5/10" in train["summary"] and "1500 tok/s" in train["summary"]
    assert "val 3.7000 (step 5)" in text
    # Older than its ETA: 0, never negative.
    progress(p, 5, eta_s=95.0, time=time.time() - 1000)
    train = status(tmp_path / "s", "--no-mlflow")[1]["stages"]["train"]
    assert train["progress"]["eta_now_s"] == 0 and "ETA 0s" in train["summary"]


def test_large_run_interrupted_says_how_to_continue(tmp_path):
    p = spec_and_results(tmp_path / "s")
    plan(p)
    progress(p, 4, checkpoint_step=4)
    _, st = status(tmp_path / "s", "--no-mlflow")
    train = st["stages"]["train"]
    assert train["state"] == "interrupted" and "checkpoint at step 4" in train["summary"]
    assert "--resume" in train["summary"] and "ETA" not in train["summary"]


def test_not_a_folder_is_a_user_error(tmp_path):
    r = CliRunner().invoke(app, ["status", str(tmp_path / "missing")])
    assert r.exit_code == 2 and "is not a folder" in r.output
    with pytest.raises(StudyError, match="not a folder"):
        study_status(tmp_path / "missing")


def test_a_fine_tuning_study_shows_the_whole_studys_epsilon_from_its_ledger(tmp_path):
    """`hpt status` reads private/privacy_ledger.json (dp/ledger.py's format, written here by the
    ledger's own writer from a made-up private run): the total ε, its δ, the budget and each read of
    private data; a ledger without its total is shown as torn, not as a number."""
    from hptransfer.dp.ledger import finetune_ledger, write_ledger
    from hptransfer.spec import parse_spec
    from test_dp_finetune import finetune_spec_dict

    spec_and_results(tmp_path / "s")
    spec = parse_spec(finetune_spec_dict())
    final = {"epsilon_spent": 7.25, "delta": 1e-4, "accountant": "rdp", "sample_rate": 0.125, "steps": 8, "clip": 0.7,
             "noise_multiplier": 0.9, "dataset_size": 256}  # fmt: skip
    path = write_ledger(StudyPaths(tmp_path / "s").privacy_ledger, finetune_ledger(spec, final, spec.data))
    text, st = status(tmp_path / "s", "--no-mlflow")
    p = st["stages"]["privacy"]
    assert p["state"] == "done" and p["epsilon_total"] == pytest.approx(7.25, rel=1e-12)
    assert "ε total 7.25 (δ 0.0001) of budget 8: 1 read(s) of private data (private large run); tuning public" in text
    doc = json.loads(path.read_text())
    del doc["total"]
    path.write_text(json.dumps(doc))
    _, st = status(tmp_path / "s", "--no-mlflow")
    assert st["stages"]["privacy"]["state"] == "torn"
