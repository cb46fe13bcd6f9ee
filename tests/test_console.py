"""What a person running `hpt run` sees (issue 15): progress lines from the coordinate check, the
sweep and the large run; none of the library noise on the console, all of it in the study's log
file; everything back with `--verbose`. One real run of a tiny spec in a fresh process, then one
`--verbose` re-run of the same study (it resumes: the sweep keeps its trials, the large run its
final checkpoint, so it is the cheaper of the two)."""

import json
import re
import subprocess
import sys

import pytest
import yaml

from conftest import tiny_spec_dict

pytestmark = pytest.mark.slow

STEPS = 10
# Printed during every large run (Ray Train, DeepSpeed, torch): off the console, in the log file.
NOISE = ["TrainingReport(", "deepspeed_shm_comm_op built", "Setting accelerator to CPU", "FutureWarning",
         "(RayTrainWorker pid=", "(TrainController pid="]
# Printed on some machines only (e.g. several Ray instances on one host): never on the console.
SOMETIMES = ["PlacementGroupCleaner", "Failed to query Ray Train Controller actor state", "Token authentication"]
PROGRESS = re.compile(r"^train step (\d+)/(\d+)  loss \d+\.\d{4}(  val \d+\.\d{4})?  tok/s \d+  ETA \S+$", re.M)


def hpt(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "hptransfer", *args], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    return r


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("console")
    spec = root / "tiny.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict(name="console", target={"width": 64, "steps": STEPS, "batch_size": 8},
                                                  train={"eval_every": 5})))
    study = root / "study"
    r = hpt("run", str(spec), "--study-dir", str(study))
    return {"spec": spec, "dir": study, "console": r.stdout + r.stderr, "log": (study / "hpt.log").read_text()}


def test_progress_lines_reach_the_console(study):
    console = study["console"]
    lines = {int(m.group(1)): m.group(0) for m in PROGRESS.finditer(console)}
    assert set(lines) == set(range(1, STEPS + 1)), console[-3000:]  # ≥ every 10% of the steps: here every step
    assert all(m.group(2) == str(STEPS) for m in PROGRESS.finditer(console))
    assert "  val " in lines[5] and "  val " in lines[10] and "  val " not in lines[4]  # val when evaluated
    assert "coord check 1/2: width 16" in console and "coord check 2/2: width 32" in console
    assert "[sweep 6/6]" in console
    assert "\x1b[" not in console  # plain text in a CI log


def test_library_noise_goes_to_the_log_file_only(study):
    console, log = study["console"], study["log"]
    for noise in NOISE + SOMETIMES:
        assert noise not in console, f"{noise!r} on the console:\n{console[-3000:]}"
    for noise in NOISE:
        assert noise in log, f"{noise!r} missing from hpt.log"
    assert "train step 10/10" in log  # our own lines are in the log file too, for context
    assert "\x1b[" not in log


def test_progress_json_and_status_of_the_finished_study(study):
    progress = json.loads((study["dir"] / "train" / "progress.json").read_text())
    assert progress["step"] == progress["total"] == STEPS and progress["status"] == "ok"
    assert progress["eta_s"] == 0 and progress["tokens_per_s"] > 0 and progress["time"] > progress["started"]
    st = json.loads(hpt("status", str(study["dir"]), "--json").stdout)
    states = {k: v["state"] for k, v in st["stages"].items()}
    assert states == {"spec": "done", "coord_check": "pass", "sweep": "done", "plan": "done", "train": "done",
                      "report": "done"}
    assert st["stages"]["sweep"]["by_status"] == {"ok": 6}
    assert st["stages"]["train"]["final"]["step"] == STEPS
    kinds = sorted(r["kind"] for r in st["mlflow"]["runs"])
    assert kinds == ["sweep", "train"] and st["mlflow"]["runs_by_kind"]["trial"] == 6
    assert st["mlflow"]["tracking_uri"] == f"sqlite:///{study['dir'] / 'mlflow.db'}"


def test_verbose_brings_the_noise_back(study):
    r = hpt("--verbose", "run", str(study["spec"]), "--study-dir", str(study["dir"]), "--skip-coord-check")
    console = r.stdout + r.stderr
    for noise in ("TrainingReport(", "deepspeed_shm_comm_op built", "(RayTrainWorker pid="):
        assert noise in console, f"{noise!r} not on the console under --verbose:\n{console[-3000:]}"
    assert "6/6 trials kept" in console and f"resumed from the checkpoint at step {STEPS}/{STEPS}" in console
    assert "\x1b[" not in console
    # the re-run found the large run finished: its final metrics are still those of the last step
    final = json.loads((study["dir"] / "train" / "train_metrics.json").read_text())["final"]
    assert final["step"] == STEPS and final["status"] == "ok" and "val_loss" in final
