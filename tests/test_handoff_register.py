"""`hpt handoff PLAN --register NAME`: the folder, checked by a plain torch + transformers loop, becomes a
version of an MLflow registered model that MLflow alone can load back; a folder that loop does not
reproduce is not registered; the verb's console is quiet (the libraries' lines go to the log file).

On an MLflow SQLite store (MLflow's own registry; the tracking server serves the same store)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import mlflow
import pytest
import torch
from transformers import AutoModelForCausalLM

from hptransfer.errors import PlanError
from hptransfer.handoff.register import CONFORMANCE_TOL, register_handoff
from hptransfer.plan import save_plan
from test_handoff_conformance import LLAMA, make_plan

NAME = "tiny-llama"
# What the libraries print when the verb imports them (DeepSpeed's accelerator line, transformers'
# save bar, torchtitan's and Megatron's import notes): the log file's, not the console's.
LIBRARY_NOISE = ("Setting accelerator", "Writing model shards", "HF assets path", "Apex", "initial_load_model_only")


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    root = tmp_path_factory.mktemp("register")
    plan = save_plan(make_plan(LLAMA), root / "transfer_plan.yaml")
    uri = f"sqlite:///{root}/mlflow.db"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    cmd = [sys.executable, "-m", "hptransfer", "handoff", str(plan), "--out", str(root / "ho")]
    proc = subprocess.run([*cmd, "--register", NAME, "--tracking-uri", uri], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"root": root, "plan": plan, "uri": uri, "out": root / "ho", "console": proc.stdout + proc.stderr}


def test_registered_version_says_what_to_train_and_loads_with_mlflow_and_transformers_alone(registered, tmp_path):
    c = mlflow.MlflowClient(registered["uri"])
    (mv,) = c.search_model_versions(f"name = '{NAME}'")
    assert str(mv.version) == "1" and f"registered {NAME} version 1" in registered["console"]
    assert mv.tags["hpt.plan_sha256"] == hashlib.sha256(registered["plan"].read_bytes()).hexdigest()
    assert (mv.tags["hpt.rule"], mv.tags["hpt.target_width"], mv.tags["hpt.target_steps"]) == ("mup", "64", "10")
    assert float(mv.tags["hpt.conformance_max_rel_error"]) <= CONFORMANCE_TOL
    run = c.get_run(mv.run_id)
    assert run.data.tags["hpt.kind"] == "handoff" and run.info.status == "FINISHED"
    assert run.data.metrics["conformance_max_rel_error"] <= CONFORMANCE_TOL

    mlflow.set_tracking_uri(registered["uri"])
    got = mlflow.artifacts.download_artifacts(f"models:/{NAME}/1", dst_path=str(tmp_path))
    with open(f"{got}/optimizer.json") as f:
        assert json.load(f)["lr"] == pytest.approx(0.02, rel=1e-9)
    model = AutoModelForCausalLM.from_pretrained(f"{got}/model")
    ref = AutoModelForCausalLM.from_pretrained(registered["out"] / "model")
    for (n, a), (_, b) in zip(model.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=n)


def test_the_console_is_quiet_and_the_log_file_keeps_the_libraries_lines(registered):
    console, log = registered["console"], (registered["root"] / "hpt.log").read_text()
    assert not [s for s in LIBRARY_NOISE if s in console], console
    assert "Setting accelerator" in log  # DeepSpeed's own-handler logger, rerouted, not dropped


def test_a_second_registration_is_version_2_and_an_unreproduced_folder_is_refused(registered):
    reg = register_handoff(registered["out"], registered["plan"], NAME, tracking_uri=registered["uri"])
    assert reg.version == "2" and reg.max_rel_error <= CONFORMANCE_TOL

    losses = registered["out"] / "conformance" / "losses.json"
    want = json.loads(losses.read_text())
    losses.write_text(json.dumps({"train_loss": [x * (1 + 1e-3) for x in want["train_loss"]]}))
    try:
        with pytest.raises(PlanError) as e:
            register_handoff(registered["out"], registered["plan"], NAME, tracking_uri=registered["uri"])
    finally:
        losses.write_text(json.dumps(want))
    msg = str(e.value)
    assert "--register" in msg and f"promises {CONFORMANCE_TOL:g}" in msg and "not registered" in msg, msg
    assert "by up to 0.000999" in msg, msg  # the measured miss: every loss scaled by 1 + 1e-3
    versions = mlflow.MlflowClient(registered["uri"]).search_model_versions(f"name = '{NAME}'")
    assert sorted(str(v.version) for v in versions) == ["1", "2"]
