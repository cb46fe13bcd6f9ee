"""optimizer.json's AdamW semantics (handoff/semantics.py): the probe tells the update rules apart that
break the fold silently, and each trainer file's check refuses an optimizer that differs.

The reference optimizers below are written here from their papers' / libraries' update rules (optax's
`eps_root`, Adam without bias correction), one step each, not taken from hptransfer."""

from __future__ import annotations

import math

import pytest
import torch

from hptransfer.handoff.groups import OptimizerSpec
from hptransfer.handoff.semantics import ASSUMED, probe

BETAS = (0.9, 0.95)


class RefAdamW(torch.optim.Optimizer):
    """p ← p·(1 − lr·wd) − lr·m̂/(√(v̂ + eps_root) + eps) with optional bias correction (optax's
    adamw with eps_root when `eps_root`; Adam as first published without its correction when not)."""

    def __init__(self, params, lr, weight_decay, eps, betas, eps_root=False, bias_correction=True):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, eps=eps, betas=betas))
        self.eps_root, self.bias_correction = eps_root, bias_correction

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            for p in g["params"]:
                s = self.state[p]
                if not s:
                    s.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
                s["t"] += 1
                s["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
                s["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m, v = s["m"], s["v"]
                if self.bias_correction:
                    m, v = m / (1 - b1 ** s["t"]), v / (1 - b2 ** s["t"])
                denom = (v + g["eps"]).sqrt() if self.eps_root else v.sqrt() + g["eps"]
                p.mul_(1 - g["lr"] * g["weight_decay"]).sub_(g["lr"] * m / denom)


def test_torch_adamw_has_the_semantics_optimizer_json_assumes_in_every_implementation():
    for impl in ({"foreach": False}, {"foreach": True}, {"fused": True}):
        got = probe(
            lambda p, lr, wd, eps, impl=impl: torch.optim.AdamW([p], lr=lr, weight_decay=wd, eps=eps, betas=BETAS, **impl), BETAS
        )
        assert got == ASSUMED, impl
    ref = probe(lambda p, lr, wd, eps: RefAdamW([p], lr, wd, eps, BETAS), BETAS)
    assert ref == ASSUMED  # the reference without its variations is torch's AdamW


@pytest.mark.parametrize(
    ("make", "field", "value"),
    [
        (
            lambda p, lr, wd, eps: torch.optim.Adam([p], lr=lr, weight_decay=wd, eps=eps, betas=BETAS),
            "weight_decay",
            "l2-in-gradient",
        ),
        # Composer's DecoupledAdamW decays by wd · lr_t / lr_0, i.e. wd alone at the peak LR
        (
            lambda p, lr, wd, eps: torch.optim.AdamW([p], lr=lr, weight_decay=wd / lr, eps=eps, betas=BETAS),
            "weight_decay",
            "decoupled-not-times-lr",
        ),
        (lambda p, lr, wd, eps: RefAdamW([p], lr, wd, eps, BETAS, eps_root=True), "eps", "inside-sqrt"),
        (lambda p, lr, wd, eps: RefAdamW([p], lr, wd, eps, BETAS, bias_correction=False), "bias_correction", False),
    ],
    ids=["torch-Adam-L2", "decay-not-times-lr", "eps-root", "no-bias-correction"],
)
def test_the_probe_names_each_variant_that_breaks_the_fold(make, field, value):
    got = probe(make, BETAS)
    assert getattr(got, field) == value
    assert all(getattr(got, k) == v for k, v in ASSUMED if k != field), got  # and only that property


def test_missing_bias_correction_is_seen_where_its_first_step_coincides():
    """β = (0.9, 0.99): (1 − β1)/√(1 − β2) = 1, so an uncorrected first step equals a corrected one;
    the second step differs (0.19/√0.0199 ≈ 1.35)."""
    betas = (0.9, 0.99)
    assert (1 - betas[0]) / math.sqrt(1 - betas[1]) == pytest.approx(1.0, rel=1e-12)
    got = probe(lambda p, lr, wd, eps: RefAdamW([p], lr, wd, eps, betas, bias_correction=False), betas)
    assert got.bias_correction is False
    assert probe(
        lambda p, lr, wd, eps: torch.optim.AdamW([p], lr=lr, weight_decay=wd, eps=eps, betas=betas), betas
    ).bias_correction


def test_optimizer_json_states_the_semantics_and_reads_files_without_them():
    base = {
        "lr": 0.01, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0,
        "param_groups": [{"pattern": ".*", "lr_mult": 1.0, "wd_mult": 1.0, "eps_mult": 1.0}],
        "schedule": {"warmup_steps": 0, "total_steps": 4, "min_lr_rate": 0.1},
    }  # fmt: skip
    spec = OptimizerSpec.model_validate(base)  # a version-1 file written before the block existed
    dumped = spec.model_dump(mode="json")["adamw"]
    assert dumped == {"weight_decay": "decoupled-times-group-lr", "eps": "outside-sqrt", "bias_correction": True}
    with pytest.raises(ValueError, match="adamw.eps"):
        OptimizerSpec.model_validate({**base, "adamw": {"eps": "eps_root"}})
