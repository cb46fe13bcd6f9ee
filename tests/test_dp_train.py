"""DP training with real Opacus: the normalized clipping form, Poisson sampling at q = B/N, and a
DP fine-tuning run on the offline digits task that ends within its ε, with ε logged to MLflow.

(DP on two Ray Train workers is tested on the private large run, tests/test_dp_large_run.py: global
q = B/N in the accountant, ε ≤ target, mean global batch ≈ B, two DPDDP workers, learning.)"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils.data import TensorDataset

from hptransfer.dp import task as digits
from hptransfer.dp.plan import dp_plan_for
from hptransfer.dp.train import PrivacyBudgetExceeded, train_dp
from hptransfer.privacy import DPConfig


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # Tiny models on a shared 2-core machine: intra-op threads only add contention (a DP run of 336
    # steps took 59 s with 2 threads under load, 3.6 s with 1).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_update_is_the_normalized_clipped_mean():
    """With σ = 0 and q = 1, one DP-SGD step must move θ by −η·(1/B)·Σ g_i·min(1/C, 1/‖g_i‖)."""
    torch.manual_seed(0)
    x, y = torch.randn(12, 3), torch.randint(0, 2, (12,))
    model = nn.Linear(3, 2)
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    ref = nn.Linear(3, 2)

    def loss(p, xi, yi):
        return nn.functional.cross_entropy(functional_call(ref, p, (xi[None],)), yi[None])

    g = vmap(grad(loss), in_dims=(None, 0, 0))(w0, x, y)
    norms = torch.sqrt(sum(v.flatten(1).pow(2).sum(1) for v in g.values()))
    clip = float(norms.median())  # some examples clipped, some not
    assert (norms < clip).any() and (norms > clip).any()
    res = train_dp(
        model,
        TensorDataset(x, y),
        batch_size=12,
        steps=1,
        noise_multiplier=0.0,
        clip=clip,
        lr=0.1,
        target_epsilon=math.inf,
        delta=1e-5,
        accountant="rdp",
        optimizer="sgd",
    )
    assert res.batch_sizes == [12]
    scale = torch.minimum(torch.full_like(norms, 1 / clip), 1 / norms)
    for k, p in model.named_parameters():
        want = w0[k] - 0.1 * (g[k] * scale.view(-1, *[1] * (g[k].dim() - 1))).sum(0) / 12
        torch.testing.assert_close(p.detach(), want, atol=1e-6, rtol=1e-5)


def test_poisson_sampling_uses_q_equal_b_over_n():
    n, b, steps = 672, 100, 120  # 1/ceil(N/B) = 1/7 = 0.1429 would be wrong; q = 100/672 = 0.1488
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(n, 4), torch.randint(0, 3, (n,)))
    res = train_dp(
        nn.Linear(4, 3),
        data,
        batch_size=b,
        steps=steps,
        noise_multiplier=1.0,
        clip=1.0,
        lr=1e-3,
        target_epsilon=100.0,
        delta=1e-5,
        accountant="rdp",
    )
    assert res.sample_rate == b / n
    assert res.accountant_history == [(1.0, b / n, steps)]  # the accountant saw q = B/N for exactly T steps
    sizes = torch.tensor(res.batch_sizes, dtype=torch.float64)
    assert len(sizes) == steps
    se = math.sqrt(b * (1 - b / n) / steps)  # std of the mean of Binomial(N, q) batch sizes
    assert abs(sizes.mean().item() - b) < 4 * se, sizes.mean()
    assert sizes.std().item() > 3  # Poisson sampling: batch sizes vary (Binomial std ≈ 9.2)


def test_refuses_a_noise_level_that_would_overspend():
    data = TensorDataset(torch.randn(100, 4), torch.randint(0, 2, (100,)))
    with pytest.raises(PrivacyBudgetExceeded, match="target 1"):
        train_dp(
            nn.Linear(4, 2),
            data,
            batch_size=10,
            steps=50,
            noise_multiplier=0.3,
            clip=1.0,
            lr=1e-3,
            target_epsilon=1.0,
            delta=1e-5,
            accountant="rdp",
        )


def test_dp_finetune_on_digits_ends_within_epsilon_and_logs_to_mlflow(tmp_path):
    import mlflow
    from mlflow.tracking import MlflowClient

    task = digits.load_task()
    body = digits.pretrain(task, epochs=5)
    cfg = DPConfig(
        epsilon=2.0, epochs=4, batch_sizes=[32, 64, 128], accountant="prv", clip_reference=digits.public_grad_norm(body, task)
    ).with_dataset_size(task.private_size)
    plan = dp_plan_for(cfg)
    model = digits.finetune_model(body)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("dp-test")
    with mlflow.start_run() as run:
        res = train_dp(
            model,
            task.private_train,
            batch_size=plan.batch_size,
            steps=plan.steps,
            noise_multiplier=plan.noise_multiplier,
            clip=plan.clip,
            lr=3e-3,
            target_epsilon=cfg.epsilon,
            delta=cfg.delta,
            accountant=cfg.accountant,
            log_metrics=lambda m, s: mlflow.log_metrics(m, step=s),
            eval_fn=digits.test_accuracy_fn(task),
        )
    assert res.epsilon <= cfg.epsilon
    assert res.steps == plan.steps and res.accountant_history[0][1] == plan.batch_size / task.private_size
    hist = MlflowClient(uri).get_metric_history(run.info.run_id, "dp/epsilon")
    eps = [m.value for m in sorted(hist, key=lambda m: m.step)]
    passes = math.ceil(plan.steps / int(1 / plan.sample_rate))
    assert len(eps) == passes and eps == sorted(eps) and 0 < eps[0] < eps[-1] <= cfg.epsilon
    acc = digits.accuracy(model, task.private_test_x, task.private_test_y)
    assert acc > 0.4, acc  # 5 classes: chance is 0.2; pre-trained features transfer
