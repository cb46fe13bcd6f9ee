"""`hpt train PLAN` on a `dp` plan: the byte-level LM trained privately on Ray Train workers with real
Opacus (DPDDP over gloo), Poisson sampling at q = B/N with the plan's B, T, σ and C, ε logged per
epoch to MLflow and written to train_metrics.json, and a worker killed mid-run resuming with the
accountant's state so ε equals an uninterrupted run's. Bad DP input fails with DP errors (exit 2)
before any worker starts."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

from hptransfer.errors import DPError
from hptransfer.plan import TransferPlan, save_plan
from hptransfer.spec import parse_spec
from hptransfer.study import Study
from hptransfer.train.private import check_private_plan
from hptransfer.transfer.engine import make_plan
from hptransfer.transfer.synthetic import synthetic_sweep

from conftest import tiny_spec_dict

N, EPOCHS, B = 256, 3, 32  # T = ceil(E·N/B) = 24 steps, 3 expected epochs of 8 steps
T = 24
EPSILON, DELTA = 4.0, 1e-4


def _spec(**dp):
    return parse_spec(tiny_spec_dict(
        name="dp-lm", model={"family": "mlp", "depth": 1, "seq_len": 16, "parametrization": "mup"},
        sweep={"widths": [16, 32], "grid": {"lr": [0.003, 0.01, 0.03]}, "steps": 12, "batch_size": 8,
               "fixed": {"warmup_steps": 2}},
        target={"width": 32}, transfer={"rule": "dp"},
        train={"workers": 2, "checkpoint_every": 4, "eval_every": 12, "max_failures": 2},
        dp={"epsilon": EPSILON, "delta": DELTA, "dataset_size": N, "epochs": EPOCHS, "batch_sizes": [B],
            "min_steps": 8, "accountant": "rdp", "clip_reference": 1.0, **dp}))


@pytest.fixture(scope="module")
def plan() -> TransferPlan:
    """The plan `hpt transfer` makes for the DP study (rule `dp`, item 2): it is what gets trained."""
    return make_plan(_spec(), synthetic_sweep([16, 32], [0.003, 0.01, 0.03], nu_inf=0.01))


def _edit(plan: TransferPlan, target: dict | None = None, config: dict | None = None, **dp) -> TransferPlan:
    data = plan.model_dump(mode="json")
    data["target"].update(target or {})
    data["dp"].update(dp)
    data["dp"]["config"].update(config or {})
    return TransferPlan.model_validate(data)


# --- no Ray: the plan, the data, per-example gradients, bad input ---------------------------------

def test_the_plan_fixes_n_b_t_sigma_and_c(plan):
    assert (plan.target.batch_size, plan.target.steps) == (B, T)
    run = check_private_plan(plan, available=10**6)
    assert (run.dataset_size, run.batch_size, run.steps, run.sample_rate) == (N, B, T, B / N)
    assert run.noise_multiplier == plan.dp["noise_multiplier"] and run.clip == plan.dp["clip"] == 1.0
    assert run.planned_epsilon <= EPSILON and run.epochs == EPOCHS


def test_private_examples_are_non_overlapping_sequences_of_the_corpus(plan):
    from hptransfer.data import load_corpus
    from hptransfer.dp.lm import private_sequences, sequence_count

    train = load_corpus(plan.data.val_fraction, plan.data.max_files).train
    assert sequence_count(plan.data, 16) == len(train) // 17
    seqs = private_sequences(plan.data, 16, N)
    assert seqs.shape == (N, 17) and torch.equal(seqs.flatten(), train[:N * 17].long())
    with pytest.raises(ValueError, match="fewer than N"):
        private_sequences(plan.data, 16, len(train))


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_opacus_per_example_gradients_of_the_mup_lm_are_exact():
    """µP's MuReadout scales its input by output_mult/width_mult: Opacus must see that (dp.lm)."""
    from opacus import GradSampleModule

    from hptransfer.dp.lm import register_mu_readout
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.models import lm_logits, training_setup
    from hptransfer.spec import ModelSpec

    register_mu_readout()
    spec = ModelSpec(family="mlp", depth=1, seq_len=16, parametrization="mup")
    build = lambda: training_setup(spec, 32, base_width=16, hps=Hyperparameters(lr=1e-2, output_mult=2.0),
                                   total_steps=4, seed=0).model
    model, ref = build(), build()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.1)  # a zero readout would hide every other gradient
    ref.load_state_dict(model.state_dict())
    x, y = torch.randint(0, 256, (3, 16)), torch.randint(0, 256, (3, 16))
    logits = lm_logits(GradSampleModule(model), x)
    torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).backward()
    for i in range(3):
        ref.zero_grad()
        torch.nn.functional.cross_entropy(lm_logits(ref, x[i:i + 1]).reshape(-1, 256), y[i]).backward()
        for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad_sample[i], r.grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("edit, where, text", [
    ({"config": {"epsilon": 0}}, "dp.config.epsilon", "greater than 0"),
    ({"config": {"delta": 1 / N}}, "dp.config.delta", "must be < 1/dataset_size"),
    ({"target": {"batch_size": N + 1}}, "target.batch_size", "exceeds N=256"),
    ({"config": {"min_steps": T + 1}}, "target.steps", "too small for the epoch budget"),
    ({"config": {"dataset_size": 10**9, "delta": 1e-12}}, "dp.config.dataset_size", "exceeds the"),
    ({"target": {"steps": 4 * T}}, "", "spends ε="),
    ({"noise_multiplier": 0.0}, "dp.noise_multiplier", "> 0"),
])
def test_bad_dp_plans_are_refused_before_training(plan, edit, where, text):
    from hptransfer.dp.lm import sequence_count

    bad = _edit(plan, **edit)
    with pytest.raises(DPError) as e:
        check_private_plan(bad, sequence_count(bad.data, 16))
    assert any(p.where == where and text in str(p) for p in e.value.problems), e.value


def test_hpt_train_on_a_bad_dp_plan_exits_2_naming_the_field(plan, tmp_path):
    from typer.testing import CliRunner

    from hptransfer.cli import app

    path = save_plan(_edit(plan, config={"epsilon": -1.0}), tmp_path / "transfer_plan.yaml")
    r = CliRunner().invoke(app, ["train", str(path)])
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert "DP budget" in out and "dp.config.epsilon" in out
    assert not (tmp_path / "train" / "ray_results").exists()  # refused before anything ran


# --- real Ray Train + Opacus ------------------------------------------------------------------------

def _train(plan: TransferPlan, root: Path, tracking_uri: str, **kw) -> dict:
    """The large run into root/train, as `hpt train PLAN` makes it, with a fixed DP seed so two runs
    draw the same samples and noise (the default is a secret seed)."""
    from hptransfer.train.private import run_private_train

    return run_private_train(Study(None, root, name=plan.study, tracking_uri=tracking_uri), plan, dp_seed=7, **kw)


def _kill_rank1_after_first_checkpoint(root: Path, killed: list):
    out = root / "train"
    deadline = time.time() + 240
    while time.time() < deadline:
        progress, snapshot = out / "progress.json", out / "ray_results" / "train" / "checkpoint_manager_snapshot.json"
        if progress.exists() and snapshot.exists() and "checkpoint_" in snapshot.read_text():
            os.kill(int((out / "pids" / "rank1").read_text()), signal.SIGKILL)
            killed.append(True)
            return
        time.sleep(0.02)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    return f"sqlite:///{tmp_path_factory.mktemp('dp_mlflow') / 'mlflow.db'}"


@pytest.fixture(scope="module")
def uninterrupted(ray_local, plan, tracking, tmp_path_factory):
    root = tmp_path_factory.mktemp("dp_train_a")
    return root / "train", _train(plan, root, tracking)


@pytest.mark.slow
def test_private_run_spends_at_most_epsilon_and_logs_it_per_epoch(uninterrupted, plan, tracking):
    from mlflow import MlflowClient

    out, metrics = uninterrupted
    assert metrics["status"] == "ok" and metrics["step"] == T
    saved = json.loads((out / "train_metrics.json").read_text())
    final = saved["final"]
    assert final["epsilon_spent"] <= EPSILON and final["delta"] == DELTA
    assert final["epsilon_spent"] == pytest.approx(plan.dp["epsilon_check"], rel=1e-9)
    assert saved["dp"]["accountant_history"] == [[plan.dp["noise_multiplier"], B / N, T]]  # (σ, q = B/N, T)
    # Poisson sampling: the realised global batches vary around B.
    sampled = [h["sampled_batch"] for h in saved["history"]]
    se = math.sqrt(N * (B / N) * (1 - B / N) / T)  # std of the mean of T Binomial(N, q) batch sizes
    assert len(sampled) == T and len(set(sampled)) > 3 and abs(sum(sampled) / T - B) < 4 * se
    # ε spent after every expected epoch (8 steps), in MLflow and in the history, rising to the final value.
    eps = MlflowClient(tracking).get_metric_history(metrics["mlflow_run_id"], "epsilon_spent")
    assert [m.step for m in eps] == [8, 16, 24]
    assert eps[0].value < eps[1].value < eps[2].value == pytest.approx(final["epsilon_spent"])
    assert final["val_loss"] < math.log(256)  # it learned something under noise


@pytest.mark.slow
def test_killed_worker_resumes_with_the_accountant_and_matches_epsilon(uninterrupted, plan, tracking, tmp_path):
    _, ref = uninterrupted
    killed: list = []
    watcher = threading.Thread(target=_kill_rank1_after_first_checkpoint, args=(tmp_path, killed), daemon=True)
    watcher.start()
    metrics = _train(plan, tmp_path, tracking)
    watcher.join(5)
    assert killed, "no worker was killed"
    assert 0 < metrics["resumed_from_step"] < T, metrics
    assert metrics["status"] == "ok" and metrics["accounted_steps"] == T
    assert metrics["epsilon_spent"] == ref["epsilon_spent"] <= EPSILON  # steps before the checkpoint counted once
    # Same samples and noise per step, model/optimizer/schedule restored: the same run.
    assert metrics["train_loss"] == pytest.approx(ref["train_loss"], rel=1e-4)
    assert metrics["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-4)
