"""`hpt train PLAN` on a `dp` plan: a language model DP-fine-tuned on Ray Train workers with real Opacus
(DPDDP over gloo). The scenario is the user's: a private JSON Lines corpus fine-tunes a µP Llama
handed off by an earlier study (its hf_model/), with Poisson sampling at q = B/N and the plan's B, T,
σ and C; ε is logged per epoch to MLflow and written to train_metrics.json; a worker killed mid-run
resumes with the accountant's state, so ε equals an uninterrupted run's. Bad DP input fails with DP
errors (exit 2) before any worker starts. The uninterrupted run also carries the assertions of the
digits run on two DPDDP workers that tests/test_dp_train.py had (dp/distributed.py is gone)."""

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

from hptransfer.context import StudyContext
from hptransfer.errors import DPError
from hptransfer.hyperparameters import Hyperparameters
from hptransfer.models import build_model, evaluate
from hptransfer.plan import TransferPlan, save_plan
from hptransfer.spec import parse_spec
from hptransfer.train.private import check_private_plan
from hptransfer.transfer.engine import make_plan
from hptransfer.transfer.synthetic import synthetic_sweep

from conftest import tiny_spec_dict

N, EPOCHS, B = 256, 3, 32  # T = ceil(E·N/B) = 24 steps, 3 expected epochs of 8 steps
T = 24
EPSILON, DELTA = 4.0, 1e-4
MODEL = {"family": "llama", "depth": 1, "head_dim": 16, "seq_len": 16, "parametrization": "mup"}


@pytest.fixture(scope="module")
def private_jsonl(tmp_path_factory) -> Path:
    """A small private corpus, one record per line (synthetic, offline)."""
    import random

    rng = random.Random(0)
    words = [
        "patient",
        "visited",
        "clinic",
        "reported",
        "mild",
        "pain",
        "dose",
        "was",
        "adjusted",
        "follow",
        "up",
        "in",
        "two",
        "weeks",
    ]
    path = tmp_path_factory.mktemp("private") / "records.jsonl"
    path.write_text(
        "".join(json.dumps({"text": f"record {i}: " + " ".join(rng.choice(words) for _ in range(12))}) + "\n" for i in range(400))
    )
    return path


@pytest.fixture(scope="module")
def handed_off(tmp_path_factory) -> Path:
    """What an earlier study's large run hands off (train/hf_model/): a µP Llama at the target width,
    saved by `save_handoff` (readout folded); its own base width differs from the DP study's."""
    from hptransfer.models.handoff import save_handoff
    from hptransfer.spec import ModelSpec

    spec = ModelSpec(**MODEL)
    model = build_model(spec, 32, base_width=32, hps=Hyperparameters(output_mult=2.0), seed=3)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.02)  # a trained readout is not zero
    out = tmp_path_factory.mktemp("earlier_study") / "hf_model"
    save_handoff(model, out, spec_model=spec, width=32, base_width=32)
    return out


def _spec(corpus: Path, init_from: Path | None, **dp):
    return parse_spec(
        tiny_spec_dict(
            name="dp-lm",
            model=MODEL,
            data={"corpus": "files", "paths": [str(corpus)], "cache_dir": str(corpus.parent / "cache"), "eval_batches": 2},
            sweep={
                "widths": [16, 32],
                "grid": {"lr": [0.003, 0.01, 0.03]},
                "steps": 12,
                "batch_size": 8,
                "fixed": {"warmup_steps": 2},
            },
            target={"width": 32},
            transfer={"rule": "dp"},
            train={"workers": 2, "checkpoint_every": 4, "eval_every": 12, "max_failures": 2},
            dp={
                "epsilon": EPSILON,
                "delta": DELTA,
                "dataset_size": N,
                "epochs": EPOCHS,
                "batch_sizes": [B],
                "min_steps": 8,
                "accountant": "rdp",
                "clip_reference": 1.0,
                "init_from": str(init_from) if init_from else None,
                **dp,
            },
        )
    )


@pytest.fixture(scope="module")
def plan(private_jsonl, handed_off) -> TransferPlan:
    """The plan `hpt transfer` makes for the DP study (rule `dp`, item 2): it is what gets trained."""
    return make_plan(_spec(private_jsonl, handed_off), synthetic_sweep([16, 32], [0.003, 0.01, 0.03], nu_inf=0.01))


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


def test_private_examples_are_non_overlapping_sequences_of_the_jsonl_corpus(plan):
    from hptransfer.data import open_corpus
    from hptransfer.dp.lm import private_sequences, sequence_count

    train = torch.from_numpy(open_corpus(plan.data).train.astype("int64"))  # the prepared training tokens
    assert sequence_count(plan.data, 16) == len(train) // 17 >= N
    seqs = private_sequences(plan.data, 16, N)
    assert seqs.shape == (N, 17) and torch.equal(seqs.flatten(), train[: N * 17])
    with pytest.raises(ValueError, match="fewer than N"):
        private_sequences(plan.data, 16, len(train))


def test_a_handed_off_model_starts_the_plans_model_with_its_logits(handed_off):
    """Weights of another study (base width 32, output_mult 2) go into the plan's model (base width
    16, output_mult 1): the readout is unfolded with the plan's multiplier, so the logits are equal."""
    from hptransfer.dp.lm import check_init_from, load_init_from
    from hptransfer.models import lm_logits
    from hptransfer.models.handoff import load_handoff
    from hptransfer.spec import ModelSpec

    spec = ModelSpec(**MODEL)
    model = build_model(spec, 32, base_width=16, seed=0)
    assert check_init_from(handed_off, model) == []
    load_init_from(model, handed_off)
    x = torch.randint(0, 256, (2, 16))
    torch.testing.assert_close(lm_logits(model, x), lm_logits(load_handoff(handed_off), x))
    wider = build_model(spec, 64, base_width=16, seed=0)
    assert any("shapes differ" in p for p in check_init_from(handed_off, wider))


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
    build = lambda: (
        training_setup(spec, 32, base_width=16, hps=Hyperparameters(lr=1e-2, output_mult=2.0), total_steps=4, seed=0).model
    )
    model, ref = build(), build()
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.1)  # a zero readout would hide every other gradient
    ref.load_state_dict(model.state_dict())
    x, y = torch.randint(0, 256, (3, 16)), torch.randint(0, 256, (3, 16))
    logits = lm_logits(GradSampleModule(model), x)
    torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).backward()
    for i in range(3):
        ref.zero_grad()
        torch.nn.functional.cross_entropy(lm_logits(ref, x[i : i + 1]).reshape(-1, 256), y[i]).backward()
        for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad_sample[i], r.grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize(
    "edit, where, text",
    [
        ({"config": {"epsilon": 0}}, "dp.config.epsilon", "greater than 0"),
        ({"config": {"delta": 1 / N}}, "dp.config.delta", "must be < 1/dataset_size"),
        ({"target": {"batch_size": N + 1}}, "target.batch_size", "exceeds N=256"),
        ({"config": {"min_steps": T + 1}}, "target.steps", "too small for the epoch budget"),
        ({"config": {"dataset_size": 10**9, "delta": 1e-12}}, "dp.config.dataset_size", "exceeds the"),
        ({"target": {"steps": 4 * T}}, "", "spends ε="),
        ({"noise_multiplier": 0.0}, "dp.noise_multiplier", "> 0"),
        ({"config": {"init_from": "/nonexistent/hf_model"}}, "dp.config.init_from", "is not a folder"),
    ],
)
def test_bad_dp_plans_are_refused_before_training(plan, edit, where, text):
    from hptransfer.dp.lm import sequence_count

    bad = _edit(plan, **edit)
    with pytest.raises(DPError) as e:
        check_private_plan(bad, sequence_count(bad.data, 16))
    assert any(p.where == where and text in str(p) for p in e.value.problems), e.value


def test_min_steps_is_the_noise_rules_floor_only(plan):
    from hptransfer.dp.lm import sequence_count

    # The predicted-loss batch rule chose T from a measured step curve: no min_steps floor.
    few = _edit(plan, config={"min_steps": T + 1}, batch_rule="predicted-loss")
    assert check_private_plan(few, sequence_count(few.data, 16)).steps == T


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
    """The large run into root/train, as `hpt train PLAN` makes it (the one driver picks the
    private recipe for a `dp` plan), with a fixed DP seed so two runs draw the same samples and
    noise (the default is a secret seed)."""
    from hptransfer.train.runner import run_train

    return run_train(StudyContext(None, root, name=plan.study, tracking_uri=tracking_uri), plan, dp_seed=7, **kw)


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


def _rdp_epsilon_integer_orders(sigma: float, q: float, steps: int, delta: float) -> float:
    """ε from the RDP of T steps of the Poisson-subsampled Gaussian at integer orders α (Mironov,
    Talwar & Zhang 2019, §3.3): RDP(α) = T/(α−1) · log Σ_k C(α,k) (1−q)^(α−k) q^k exp((k²−k)/(2σ²)),
    converted with Balle et al. 2020 (Opacus' conversion): ε = RDP(α) + log((α−1)/α) − (log δ + log α)/(α−1),
    minimised over α = 2..63. Opacus also tries fractional orders, so its ε is at most this."""
    best = math.inf
    for a in range(2, 64):
        logs = [
            math.log(math.comb(a, k)) + (a - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma**2)
            for k in range(a + 1)
        ]
        top = max(logs)
        rdp = steps * (top + math.log(sum(math.exp(v - top) for v in logs))) / (a - 1)
        best = min(best, rdp + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1))
    return best


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
    # ε of (σ, q = B/N, T) computed without hptransfer: Opacus' RDP accountant directly, and the
    # closed form of the Poisson-subsampled Gaussian's RDP at integer orders (an upper bound).
    from opacus.accountants import RDPAccountant

    sigma = plan.dp["noise_multiplier"]
    opacus = RDPAccountant()
    opacus.history = [(sigma, B / N, T)]
    assert final["epsilon_spent"] == pytest.approx(opacus.get_epsilon(DELTA), rel=1e-9)
    closed = _rdp_epsilon_integer_orders(sigma, B / N, T, DELTA)
    assert final["epsilon_spent"] <= closed == pytest.approx(final["epsilon_spent"], rel=0.01)
    assert saved["dp"]["accountant_history"] == [[sigma, B / N, T]]  # (σ, q = B/N, T): the global q, not a shard's
    assert sorted(p.name for p in (out / "pids").iterdir()) == ["rank0", "rank1"]  # two DPDDP workers
    # Poisson sampling: the realised global batches vary around B.
    sampled = [h["sampled_batch"] for h in saved["history"]]
    se = math.sqrt(N * (B / N) * (1 - B / N) / T)  # std of the mean of T Binomial(N, q) batch sizes
    assert len(sampled) == T and len(set(sampled)) > 3 and abs(sum(sampled) / T - B) < 4 * se
    # ε spent after every expected epoch (8 steps), in MLflow and in the history, rising to the final value.
    eps = MlflowClient(tracking).get_metric_history(metrics["mlflow_run_id"], "epsilon_spent")
    assert [m.step for m in eps] == [8, 16, 24]
    assert eps[0].value < eps[1].value < eps[2].value == pytest.approx(final["epsilon_spent"])
    # It fine-tuned the handed-off model (its starting val loss is that model's) and learned from the
    # private records under noise.
    from hptransfer.data import open_corpus
    from hptransfer.models.handoff import load_handoff

    val = open_corpus(plan.data).val_batches(plan.data.eval_batches, min(B, 16), 16)
    assert final["initial_val_loss"] == pytest.approx(evaluate(load_handoff(plan.dp["config"]["init_from"]), val), rel=1e-5)
    assert final["val_loss"] < final["initial_val_loss"] - 0.1
    assert (out / "hf_model" / "config.json").exists()


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


def test_an_elastic_group_is_refused_for_a_private_run(plan):
    """train.min_workers (issue 39): the private run's Poisson sampling per rank and its accountant
    assume a fixed group, so a dp plan with a worker range is refused, naming the field."""
    from hptransfer.errors import PlanError
    from hptransfer.train import private

    data = plan.model_dump(mode="json")
    data["train"].update(workers=2, min_workers=1)
    with pytest.raises(PlanError, match=r"train.min_workers=1: the private run's group is fixed"):
        private.launch(TransferPlan.model_validate(data))
