"""The language-model task of `hpt dp-sweep`: one trial DP-fine-tunes the spec's model on the
private sequences of the spec's corpus, in a single process, and reports the validation loss.

It is the private large run (`train.private`) at sweep scale, built from the same pieces:
- the examples: the first N non-overlapping sequences of `seq_len + 1` tokens of the corpus'
  training split (`dp.lm.private_sequences`), N = `dp.dataset_size` or, when null, all of them
  (`dp.lm.sequence_count`: the N `hpt transfer` derives for a DP plan);
- the model, optimizer (MuAdamW under µP) and LR schedule: `models.training_setup` at the spec's base
  width (or `--width`) with the sweep's fixed hyperparameters and the trial's LR; a fresh model, or
  the handed-off model `dp.init_from` (`dp.lm.load_init_from`), as the large run starts;
- the privacy: `dp.train.train_dp`, i.e. Opacus with Poisson sampling at q = B/N for exactly
  T = ceil(E·N/B) steps, σ from the accountant for (ε, δ, q, T), per-example clipping to C in the
  normalized form (update (Σ clip_C(g_i) + N(0, σ²C²)) / (B·C), so the LR does not depend on C), and
  ε spent read from Opacus' accountant at the end (the run raises if it exceeds the target).

One example's gradient is that of its mean next-token loss (`models.build.lm_loss`: cross-entropy
averaged over the batch's tokens; Opacus rescales by the batch size), as in the large run. The validation loss is on the
corpus' validation split, the same fixed batches for every trial; it is computed from held-out data
and is not covered by ε.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import torch

from hptransfer.errors import DPError, Problem
from hptransfer.models.build import lm_loss  # re-exported: benchmarks/dp_lm.py imports it from here
from hptransfer.spec import ModelSpec, StudySpec


@dataclass(frozen=True)
class LMTask:
    """What every trial of an LM DP sweep shares; built once by the driver (`load_lm_task`)."""

    model: ModelSpec
    width: int  # the width the trials train
    base_width: int  # µP's base width (the spec's)
    sequences: torch.Tensor  # int64 [N, seq_len + 1]: the private examples
    val: list[tuple[torch.Tensor, torch.Tensor]]  # fixed validation batches (held-out split)
    fixed: dict[str, float] = field(default_factory=dict)  # hyperparameters other than lr (spec's sweep.fixed)
    rule: str = "dp"  # selects µP's weight-decay scaling in training_setup
    init_from: str | None = None  # a handed-off model (dp.init_from), checked against `width`

    @property
    def private_size(self) -> int:
        return len(self.sequences)


def dataset_size(spec: StudySpec) -> int:
    """N: `dp.dataset_size`, or every private sequence the corpus offers when it is null."""
    from hptransfer.dp.lm import sequence_count

    assert spec.dp is not None, "call with a spec that has a dp block"
    return spec.dp.dataset_size or sequence_count(spec.data, spec.model.seq_len)


def load_lm_task(spec: StudySpec, width: int | None = None) -> LMTask:
    """The private sequences, validation batches and model settings of `spec`; raises DPError when
    the corpus has fewer than N sequences or `dp.init_from` does not fit the model at `width`."""
    from hptransfer.data import open_corpus
    from hptransfer.dp.lm import check_init_from, private_sequences
    from hptransfer.models import build_model

    assert spec.dp is not None, "call with a spec that has a dp block"
    width = width or spec.base_width
    if errs := spec.model.width_problems([width]):
        raise DPError("--width", [Problem("--width", e, width, "pick a width the model family allows") for e in errs])
    seq_len, n = spec.model.seq_len, dataset_size(spec)
    try:
        seqs = private_sequences(spec.data, seq_len, n)
    except ValueError as e:
        raise DPError(
            "dp.dataset_size", [Problem("dp.dataset_size", str(e), n, "lower it (null: all sequences) or add data")]
        ) from None
    if spec.dp.init_from:
        with torch.device("meta"):
            meta = build_model(spec.model, width, base_width=spec.base_width)
        if why := check_init_from(spec.dp.init_from, meta):
            raise DPError(
                "dp.init_from",
                [
                    Problem("dp.init_from", w, spec.dp.init_from, f"hand off a model of width {width} (or pass --width)")
                    for w in why
                ],
            )
    val = open_corpus(spec.data).val_batches(spec.data.eval_batches, spec.sweep.batch_size, seq_len)
    return LMTask(
        model=spec.model,
        width=width,
        base_width=spec.base_width,
        sequences=seqs,
        val=val,
        fixed=dict(spec.sweep.fixed),
        rule=spec.transfer.rule,
        init_from=spec.dp.init_from,
    )


def run_dp_lm_finetune(
    task: LMTask,
    *,
    epsilon: float,
    delta: float,
    epochs: float,
    batch_size: int,
    clip: float,
    lr: float,
    accountant: str = "prv",
    seed: int = 0,
    sigma: float | None = None,
    keep_model=None,
) -> dict[str, float]:
    """One trial: DP-fine-tune the task's model at (B, C, lr) with σ for (ε, δ, q = B/N, T =
    ceil(E·N/B)); returns validation loss before and after, ε spent, σ, T and the last train loss.
    `sigma`: that σ when the caller already has it (`accounting.noise_multiplier` of the same
    arguments; a driver running many trials computes each once: the PRV search takes seconds). A σ
    that would spend more than ε is refused before training (`train_dp`), so it cannot weaken privacy.

    ε = inf is the noise-free trial of the same run (σ = 0: Poisson sampling, clipping at C and the
    normalized form kept, no noise; ε spent inf): its loss against T is the step curve the
    predicted-loss batch rule fits (`dp.steps`). RDP accounts it (PRV cannot represent σ = 0).
    `keep_model(model)`: called with the trained model (the private tuning scores it itself)."""
    from torch.utils.data import TensorDataset

    from hptransfer.dp.accounting import noise_multiplier, steps_for
    from hptransfer.dp.lm import load_init_from, register_mu_readout
    from hptransfer.dp.train import train_dp
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.models import evaluate, training_setup

    n = task.private_size
    t = steps_for(n, epochs, batch_size)
    noise_free = math.isinf(epsilon)
    if noise_free:
        sigma = 0.0
    elif sigma is None:
        sigma = noise_multiplier(epsilon, delta, batch_size / n, t, accountant)
    if noise_free:
        accountant = "rdp"
    register_mu_readout()
    setup = training_setup(
        task.model,
        task.width,
        base_width=task.base_width,
        hps=Hyperparameters.of(task.fixed, {"lr": lr}),
        total_steps=t,
        seed=seed,
        rule=task.rule,
    )
    model = setup.model
    if task.init_from:
        load_init_from(model, task.init_from)
    initial = evaluate(model, task.val)
    seqs = task.sequences
    res = train_dp(
        model,
        TensorDataset(seqs[:, :-1], seqs[:, 1:]),
        batch_size=batch_size,
        steps=t,
        noise_multiplier=sigma,
        clip=clip,
        lr=None,
        optimizer=setup.optimizer,
        lr_factor=setup.lr_factor,
        loss_fn=lm_loss,
        target_epsilon=epsilon,
        delta=delta,
        accountant=accountant,
        seed=seed,
    )
    if keep_model is not None:
        keep_model(model)
    return {
        "val_loss": evaluate(model, task.val),
        "initial_val_loss": initial,
        "train_loss": res.final_loss,
        "dp/epsilon": res.epsilon,
        "sigma": sigma,
        "steps": t,
    }


def public_sequences(spec: StudySpec, n: int = 256) -> torch.Tensor | None:
    """Up to `n` sequences of the corpus' training split after the N private ones (disjoint from
    them; public in the single-corpus framing of benchmarks/dp_lm.py), for measuring per-example
    gradient norms; None when the corpus has no sequence beyond N."""
    from hptransfer.dp.lm import private_sequences, sequence_count

    big_n, avail = dataset_size(spec), sequence_count(spec.data, spec.model.seq_len)
    extra = min(n, avail - big_n)
    return private_sequences(spec.data, spec.model.seq_len, big_n + extra)[big_n:] if extra > 0 else None


def per_example_grad_norms(task: LMTask, sequences: torch.Tensor, seed: int = 0) -> list[float]:
    """‖g_i‖ of each sequence's mean next-token loss at the model a trial starts from (the task's
    width, `init_from` when set), by Opacus' per-sample gradients: the distribution the clipping
    bound is read from (`dp.rule.clip_from_norms`). Measure it on public sequences: C set from
    private norms would itself leak."""
    from opacus import GradSampleModule

    from hptransfer.dp.lm import load_init_from, register_mu_readout
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.models import training_setup

    register_mu_readout()
    model = training_setup(
        task.model,
        task.width,
        base_width=task.base_width,
        hps=Hyperparameters.of(task.fixed, {"lr": 1.0}),
        total_steps=1,
        seed=seed,
        rule=task.rule,
    ).model
    if task.init_from:
        load_init_from(model, task.init_from)
    gsm = GradSampleModule(model)
    # lm_loss is a mean over the batch; GradSampleModule (loss_reduction="mean") rescales grad_sample
    # by the batch size, so each row is the gradient of that sequence's own mean loss.
    with warnings.catch_warnings():  # Opacus' hooks on inputs that need no grad: harmless
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        lm_loss(gsm(sequences[:, :-1]), sequences[:, 1:]).backward()
    sq = sum(p.grad_sample.flatten(1).pow(2).sum(1) for p in model.parameters() if p.grad_sample is not None)
    norms = torch.sqrt(sq)
    gsm.remove_hooks()
    return [float(x) for x in norms]
