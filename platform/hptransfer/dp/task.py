"""An offline DP transfer-learning task on scikit-learn's bundled `digits` (8×8 images, 1,797 of them).

Public part: digits 0–4, used to pre-train a small MLP backbone without privacy. Private part:
digits 5–9 (disjoint examples and classes), split into a private training set and a test set; the
backbone is DP-fine-tuned on it with a fresh zero-initialised head. Transfer is real: the features
learned on 0–4 are reused for 5–9; the private set is small (N ≈ 680), so DP noise matters.
No downloads: the data ships inside scikit-learn.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import TensorDataset

PUBLIC_CLASSES = (0, 1, 2, 3, 4)
PRIVATE_CLASSES = (5, 6, 7, 8, 9)


@dataclass(frozen=True)
class DigitsTask:
    public_x: torch.Tensor
    public_y: torch.Tensor
    private_train: TensorDataset
    private_test_x: torch.Tensor
    private_test_y: torch.Tensor

    @property
    def private_size(self) -> int:
        return len(self.private_train)


def load_task(test_fraction: float = 0.25, split_seed: int = 0) -> DigitsTask:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    pub = torch.isin(y, torch.tensor(PUBLIC_CLASSES))
    px, py = x[~pub], y[~pub] - len(PUBLIC_CLASSES)  # private labels 0..4
    perm = torch.randperm(len(py), generator=torch.Generator().manual_seed(split_seed))
    n_test = int(round(test_fraction * len(py)))
    te, tr = perm[:n_test], perm[n_test:]
    return DigitsTask(
        public_x=x[pub],
        public_y=y[pub],
        private_train=TensorDataset(px[tr], py[tr]),
        private_test_x=px[te],
        private_test_y=py[te],
    )


def backbone(width: int = 64) -> nn.Sequential:
    # No BatchNorm: per-example gradients (and DP) need layers without cross-example statistics.
    return nn.Sequential(nn.Linear(64, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())


def pretrain(task: DigitsTask, width: int = 64, epochs: int = 15, lr: float = 3e-3, seed: int = 0) -> nn.Sequential:
    """Non-private pre-training on the public part; returns the backbone (head dropped)."""
    torch.manual_seed(seed)
    body = backbone(width)
    model = nn.Sequential(body, nn.Linear(width, len(PUBLIC_CLASSES)))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(task.public_y), generator=gen).split(32):
            opt.zero_grad()
            nn.functional.cross_entropy(model(task.public_x[idx]), task.public_y[idx]).backward()
            opt.step()
    return body


def finetune_model(body: nn.Sequential) -> nn.Sequential:
    """A copy of the pre-trained backbone with a fresh zero-initialised head for the private classes
    (zero head: the first DP steps do not start from random logits)."""
    body = copy.deepcopy(body)
    width = body[-2].out_features
    head = nn.Linear(width, len(PRIVATE_CLASSES))
    nn.init.zeros_(head.weight), nn.init.zeros_(head.bias)
    return nn.Sequential(body, head)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean())


def test_accuracy_fn(task: DigitsTask) -> Callable[[nn.Module], dict[str, float]]:
    return lambda m: {"test/accuracy": accuracy(m, task.private_test_x, task.private_test_y)}


def public_grad_norm(body: nn.Sequential, task: DigitsTask, seed: int = 0) -> float:
    """Median per-example gradient norm of a fresh fine-tuning model on PUBLIC data (public labels):
    a privacy-free reference scale for the clipping grid (`DPConfig.clip_reference`)."""
    from torch.func import functional_call, grad, vmap

    torch.manual_seed(seed)
    model = finetune_model(body)
    nn.init.normal_(model[1].weight, std=0.01)  # a zero head has zero backbone gradients
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, y):
        return nn.functional.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    g = vmap(grad(loss), in_dims=(None, 0, 0))(params, task.public_x, task.public_y)
    norms = torch.sqrt(sum(v.flatten(1).pow(2).sum(1) for v in g.values()))
    return float(norms.median())


def run_dp_finetune(
    task: DigitsTask,
    body: nn.Sequential,
    *,
    epsilon: float,
    delta: float,
    epochs: float,
    batch_size: int,
    clip: float,
    lr: float,
    accountant: str = "prv",
    seed: int = 0,
    log_metrics=None,
) -> dict[str, float]:
    """DP-fine-tune a copy of `body` with σ chosen for (ε, δ, q = B/N, T = ceil(E·N/B)); returns
    test accuracy and ε spent."""
    from hptransfer.dp.accounting import noise_multiplier, steps_for
    from hptransfer.dp.train import train_dp

    n = task.private_size
    t = steps_for(n, epochs, batch_size)
    sigma = noise_multiplier(epsilon, delta, batch_size / n, t, accountant)
    model = finetune_model(body)
    res = train_dp(
        model,
        task.private_train,
        batch_size=batch_size,
        steps=t,
        noise_multiplier=sigma,
        clip=clip,
        lr=lr,
        target_epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        seed=seed,
        log_metrics=log_metrics,
    )
    return {
        "test/accuracy": accuracy(model, task.private_test_x, task.private_test_y),
        "dp/epsilon": res.epsilon,
        "sigma": sigma,
        "steps": t,
    }
