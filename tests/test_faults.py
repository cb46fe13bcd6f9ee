"""Faults a cluster really has, the fast half (no Ray): torn files are told from whole ones (a
checkpoint's manifest, the sidecar of sweep_results.csv and transfer_plan.yaml), a full disk while a
checkpoint is written (a real tiny tmpfs, else RLIMIT_FSIZE) keeps the previous checkpoint intact,
and what MLflow does not take while it is down is spooled and delivered later. The real-process
half (SIGTERM, a SIGKILLed driver, a stopped `mlflow server`) is tests/test_faults_run.py."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from hptransfer.errors import PlanError, ResultsError
from hptransfer.io import sidecar, torn, write_checked
from hptransfer.layout import TrainPaths
from hptransfer.plan import TargetShape, TransferPlan, load_plan, save_plan
from hptransfer.spec import parse_spec
from hptransfer.train import checkpoints as ck

from conftest import free_port, tiny_spec_dict


def _plan() -> TransferPlan:
    spec = parse_spec(tiny_spec_dict())
    return TransferPlan(
        study="faults",
        rule="mup",
        model=spec.model,
        base_width=16,
        target=TargetShape(width=64, steps=6, batch_size=8, seq_len=16),
        hyperparameters={"lr": 0.01},
        data=spec.data,
        train=spec.train,
    )


def _checkpoint(folder: Path, payload: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "state.pt").write_bytes(payload)
    (folder / "sub").mkdir()
    (folder / "sub" / "optim.pt").write_bytes(payload[::-1])
    ck.write_manifest(folder)
    return folder


# --- torn checkpoints --------------------------------------------------------------------------


def test_a_torn_checkpoint_is_told_from_a_whole_one(tmp_path):
    whole = _checkpoint(tmp_path / "a", os.urandom(5000))
    assert ck.torn(whole) is None and ck.manifest_bytes(whole) == 10000
    cut = _checkpoint(tmp_path / "b", os.urandom(5000))
    os.truncate(cut / "sub" / "optim.pt", 1200)  # cut short mid-write
    assert ck.torn(cut) == "sub/optim.pt has 1200 bytes, the manifest says 5000"
    flipped = _checkpoint(tmp_path / "c", b"x" * 5000)
    (flipped / "state.pt").write_bytes(b"\0" * 5000)  # a power loss: the length is right, the bytes are zeros
    assert "SHA-256" in ck.torn(flipped)
    empty_manifest = _checkpoint(tmp_path / "d", b"y" * 100)
    (empty_manifest / ck.MANIFEST).write_bytes(b"")
    assert "unreadable" in ck.torn(empty_manifest)
    legacy = tmp_path / "e"
    legacy.mkdir()
    (legacy / "state.pt").write_bytes(b"z")  # written before manifests: used as it is
    assert ck.torn(legacy) is None


# Ray Train names checkpoints by time; the names sort in time (their trailing digits do not).
NAMES = [f"checkpoint_2026-12-04_18-46-{t}" for t in ("09.900000", "10.100000", "10.300000", "11.000000")]


def test_newest_good_falls_back_to_the_previous_whole_checkpoint_never_a_newer_one(tmp_path):
    root = tmp_path / "ray_results" / "train"
    c1, c2, c3 = (_checkpoint(root / name, os.urandom(800)) for name in NAMES[:3])
    unregistered = _checkpoint(root / NAMES[3], os.urandom(800))  # newer than Ray's latest
    assert ck.newest_good(c3) == (c3, [])
    os.truncate(c3 / "state.pt", 10)
    os.truncate(c2 / "sub" / "optim.pt", 0)  # ext4 delayed allocation after a power loss: zero length
    folder, skipped = ck.newest_good(c3)
    assert folder == c1
    assert skipped == [
        f"{NAMES[2]}: state.pt has 10 bytes, the manifest says 800",
        f"{NAMES[1]}: sub/optim.pt has 0 bytes, the manifest says 800",
    ]
    os.truncate(c1 / "state.pt", 1)
    assert ck.newest_good(c3) == (None, [*skipped, f"{NAMES[0]}: state.pt has 1 bytes, the manifest says 800"])
    assert unregistered.exists()  # never considered


def test_the_worker_tells_the_user_which_checkpoint_it_resumes_from(tmp_path):
    from hptransfer.train.loop import WorkerKit

    kit = WorkerKit({}, _plan(), TrainPaths(tmp_path / "train"), rank=0, world=1)
    root = tmp_path / "train" / "ray_results" / "train"
    c1, c2 = (_checkpoint(root / name, os.urandom(300)) for name in NAMES[:2])
    os.truncate(c2 / "state.pt", 7)

    class Restored:  # what ray.train.get_checkpoint() hands the loop: a path on shared storage
        path = str(c2)

    folder, notes = kit.restorable(Restored())
    assert folder == c1
    assert notes == [
        f"train: checkpoint {NAMES[1]}: state.pt has 7 bytes, the manifest says 300: torn (cut short while written), skipped",
        f"train: resuming from the previous whole checkpoint, {NAMES[0]}",
    ]


# --- torn plan and results table -------------------------------------------------------------


def test_a_plan_cut_short_is_refused_with_the_command_that_remakes_it(tmp_path):
    path = save_plan(_plan(), tmp_path / "transfer_plan.yaml")
    assert load_plan(path).hps.lr == 0.01 and torn(path) is None
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # what a non-atomic rename or a full disk leaves
    with pytest.raises(PlanError) as e:
        load_plan(path)
    text = str(e.value)
    assert f"has {len(whole) // 2} bytes, {len(whole)} were written" in text
    assert "hpt transfer --study-dir DIR" in text and sidecar(path).name in text
    # A hand edit that keeps the plan whole (a comment, a changed value) is the user's: accepted.
    path.write_bytes(whole.replace(b"lr: 0.01", b"lr: 0.02") + b"# tuned by hand\n")
    assert torn(path) is None and load_plan(path).hps.lr == 0.02


def test_a_results_table_cut_short_is_refused_naming_the_rerun_that_rewrites_it(tmp_path):
    from hptransfer.transfer.engine import read_results

    path = tmp_path / "sweep_results.csv"
    body = "width,lr,seed,val_loss,status\n" + "".join(f"16,0.0{i},0,{3 + i / 10},ok\n" for i in range(1, 9))
    write_checked(path, body)
    assert len(read_results(path)) == 8
    path.write_text(body[:-20])  # the last rows lost: would still parse as a shorter table
    with pytest.raises(ResultsError, match=r"cut short while it was written .*hpt sweep SPEC --study-dir DIR"):
        read_results(path)


def test_status_shows_torn_files_and_what_mlflow_did_not_take(tmp_path):
    from hptransfer.status import describe, study_status

    study = tmp_path / "study"
    save_plan(_plan(), study / "transfer_plan.yaml")
    (study / "transfer_plan.yaml").write_text("rule: mup\n")
    train = TrainPaths(study / "train")
    train.root.mkdir(parents=True)
    rows = [[{"train_loss": 2.5}, s, 0] for s in (4, 5, 6)]
    train.mlflow_unsent.write_text(
        json.dumps({"run_id": "r1", "op": "metrics", "rows": rows})
        + "\n"
        + json.dumps({"run_id": "r1", "op": "end", "status": "FINISHED"})
        + "\n"
    )
    st = study_status(study, mlflow=False)
    assert st["stages"]["plan"]["state"] == "torn"
    text = "\n".join(describe(st))
    assert "transfer_plan.yaml was cut short" in text and "`hpt transfer --study-dir DIR`" in text
    assert "NOT LOGGED (MLflow was unreachable): 3 metric rows (steps 4-6), the run's end (FINISHED) of MLflow run r1" in text
    assert f"hpt status {study} --replay-mlflow" in text


# --- a full disk while a checkpoint is written ---------------------------------------------------


class _TorchRecipe:
    """What a recipe's save_checkpoint does: torch.save of the state into the folder (as DeepSpeed does)."""

    def __init__(self, numel: int):
        self.state = {"w": torch.ones(numel)}

    def save_checkpoint(self, folder: Path, client: dict) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({**self.state, **client}, folder / "state.pt")


def _tiny_tmpfs(mount: Path, size: str) -> bool:
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    return r.returncode == 0


def test_a_full_disk_keeps_the_previous_checkpoint_and_skips_the_next_that_cannot_fit(tmp_path):
    """ENOSPC for real: a 2 MB tmpfs (needs root, as CI's container runs). A 4 MB checkpoint fills
    it: the partial folder goes, the previous checkpoint verifies, and the error says what is kept;
    the next checkpoint of that size is skipped before a byte is written, and training goes on."""
    from hptransfer.train.loop import WorkerKit

    mount = tmp_path / "disk"
    if not _tiny_tmpfs(mount, "2m"):
        pytest.skip("cannot mount a tmpfs here (not root): test_a_file_size_limit_is_a_full_disk_too covers ENOSPC's twin")
    try:
        paths = TrainPaths(mount / "train")
        previous = _checkpoint(paths.ray_experiment / "checkpoint_000000", os.urandom(100_000))
        kit = WorkerKit({}, _plan(), paths, rank=0, world=1, last_step=4)
        said: list[str] = []
        with pytest.raises(ck.CheckpointSpaceError) as e:
            kit.save_checkpoint(_TorchRecipe(1_000_000), step=8, history=[], say=said.append)
        assert "checkpoint of step 8" in str(e.value) and "checkpoint of step 4 is intact" in str(e.value)
        assert "--resume" in str(e.value)
        assert not (paths.checkpoints_local / "step0000008").exists()  # the partial folder is gone
        assert ck.torn(previous) is None  # and the previous one is whole
        kit.last_bytes = 4_000_000  # the size the run knows from its previous checkpoint
        assert kit.save_checkpoint(_TorchRecipe(1_000_000), step=12, history=[], say=said.append) is None
        assert len(said) == 1 and said[0].startswith("train: checkpoint of step 12 skipped: ")
        assert "a checkpoint needs about 8.8 MB (2 copies of 4.0 MB)" in said[0] and "checkpoint of step 4 is kept" in said[0]
        assert not paths.checkpoints_local.exists() or not any(paths.checkpoints_local.iterdir())
        del e  # its traceback holds torch's half-written file open, and a deleted open file keeps its space
        gc.collect()
        kit.last_bytes = 4_000  # a checkpoint that fits is written, with its manifest
        small = kit.save_checkpoint(_TorchRecipe(1000), step=16, history=[], say=said.append)
        assert small is not None and ck.torn(small) is None and kit.last_step == 16
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)  # a failed torch.save may hold its file until GC


def test_a_file_size_limit_is_a_full_disk_too(tmp_path):
    """RLIMIT_FSIZE (a quota's twin, no root needed), in a subprocess: the write fails with EFBIG,
    which counts as a full disk: the partial folder goes, the previous checkpoint is intact."""
    script = f"""
import resource, signal, sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_faults import _checkpoint, _plan
from hptransfer.layout import TrainPaths
from hptransfer.train import checkpoints as ck
from hptransfer.train.loop import WorkerKit

class Writer:  # a checkpoint written with Python's own file writes
    def save_checkpoint(self, folder, client):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "state.bin").write_bytes(b"x" * 3_000_000)

paths = TrainPaths(Path({str(tmp_path)!r}) / "train")
previous = _checkpoint(paths.ray_experiment / "checkpoint_000000", b"p" * 100_000)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))
kit = WorkerKit({{}}, _plan(), paths, rank=0, world=1, last_step=3)
try:
    kit.save_checkpoint(Writer(), step=6, history=[])
except ck.CheckpointSpaceError as e:
    print("SPACE", e.errno, "partial" if (paths.checkpoints_local / "step0000006").exists() else "removed", ck.torn(previous))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().splitlines()[-1:] == ["SPACE 28 removed None"], r.stdout + r.stderr[-2000:]


# --- MLflow down: spooled, then delivered ---------------------------------------------------------


@pytest.mark.slow  # MLflow's SQLite store: ~6 s of schema set-up
def test_what_mlflow_does_not_take_is_spooled_and_delivered_in_order(tmp_path):
    """A tracker whose server is unreachable (a port nobody listens on) spools every write to the
    study folder instead of raising; replaying into the store the run lives in delivers them all."""
    from mlflow import MlflowClient

    from hptransfer.tracking import MlflowTracker, Spooled, describe_unsent, fail_quickly, read_unsent, replay_unsent

    fail_quickly()
    store = f"sqlite:///{tmp_path}/mlflow.db"
    run_id = MlflowTracker(store, "faults", run_name="large").run_id
    dead = f"http://127.0.0.1:{free_port()}"
    down = Spooled(MlflowTracker(dead, "faults", run_id=run_id), tmp_path / "unsent.jsonl", dead)
    down.log_metric_rows([({"train_loss": 3.0 - s / 10, "lr": float("nan")}, s, 1000 + s) for s in (1, 2, 3)])
    down.set_tags({"hpt.note": "outage"})
    artifact = tmp_path / "train_metrics.json"
    artifact.write_text("{}")
    down.log_artifact(artifact)
    down.end("FINISHED")
    ops = read_unsent(tmp_path / "unsent.jsonl")
    assert [op["op"] for op in ops] == ["metrics", "tags", "artifact", "end"] and down.failures == 4
    assert (
        describe_unsent(ops)
        == f"3 metric rows (steps 1-3), 1 tag batch, 1 artifact, the run's end (FINISHED) of MLflow run {run_id}"
    )
    client = MlflowClient(store)
    assert client.get_run(run_id).info.status == "RUNNING" and not client.get_metric_history(run_id, "train_loss")
    assert replay_unsent(tmp_path / "unsent.jsonl", store)
    assert not (tmp_path / "unsent.jsonl").exists()
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["hpt.note"] == "outage"
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "train_loss")] == [(1, 2.9), (2, 2.8), (3, 2.7)]
    assert [a.path for a in client.list_artifacts(run_id)] == ["train_metrics.json"]
    assert ops[0]["why"].startswith("MlflowException") or "Connection" in ops[0]["why"], ops[0]["why"]
    # A store that answers takes each write at once: nothing spooled.
    up = Spooled(MlflowTracker(store, "faults", run_id=run_id), tmp_path / "up.jsonl", store)
    up.set_tags({"hpt.after": "back"})
    up.log_metrics({"final_val_loss": 2.5})
    assert not (tmp_path / "up.jsonl").exists() and up.failures == 0
    assert client.get_run(run_id).data.metrics["final_val_loss"] == 2.5
    # A store that is still down keeps everything, in order.
    (tmp_path / "again.jsonl").write_text(json.dumps({"run_id": uuid.uuid4().hex, "op": "end", "status": "KILLED"}) + "\n")
    assert not replay_unsent(tmp_path / "again.jsonl", f"http://127.0.0.1:{free_port()}")
    assert read_unsent(tmp_path / "again.jsonl")[0]["status"] == "KILLED"
