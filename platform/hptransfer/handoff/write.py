"""`hpt handoff PLAN --out DIR`: the plan's target as any trainer can train it, without hptransfer.

    DIR/model/                  the target at step 0: `save_pretrained` of a plain Hugging Face class
                                (µP init, forward multipliers folded in; handoff/fold.py says how)
    DIR/optimizer.json          AdamW settings, per-parameter regex groups, the schedule (handoff/groups.py)
    DIR/conformance/batches.pt  int64 [N, batch, seq_len + 1]: the target's first N training batches
    DIR/conformance/losses.json {"train_loss": [N floats]}: hptransfer's trainer on those batches from
                                DIR/model (one process, fp32), so a trainer can be checked in a minute
    DIR/trainers/               the same groups in torchtitan, Megatron-core, HF Trainer and DeepSpeed form
    DIR/README.md               what each file is, and the loop that reproduces losses.json

The folder appears whole or not at all (written beside it, then renamed).
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hptransfer.errors import PlanError, Problem
from hptransfer.handoff.fold import fold_plan_target
from hptransfer.handoff.groups import OPTIMIZER_FILE, OptimizerSpec, build_adamw
from hptransfer.io import write_atomic, write_json

MODEL_DIR = "model"
CONFORMANCE_DIR = "conformance"
BATCHES_FILE = "batches.pt"
LOSSES_FILE = "losses.json"
TRAINERS_DIR = "trainers"
DEFAULT_STEPS = 10


@dataclass
class HandoffResult:
    out: Path
    optimizer: OptimizerSpec
    losses: list[float]
    trainers: dict[str, Path] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def conformance_batches(plan: Any, steps: int, batch_size: int | None = None) -> torch.Tensor:
    """The target's first `steps` training batches as token windows [steps, batch, seq_len + 1]
    (input `b[:, :-1]`, targets `b[:, 1:]`), exactly those the large run draws at those steps: its
    steps count from 1 (train/loop.py, as a trial's do), so entry i is the batch of step i + 1."""
    from hptransfer.data import open_corpus

    B, T = batch_size or plan.target.batch_size, plan.target.seq_len
    corpus = open_corpus(plan.data, seq_len=T)
    out = []
    for step in range(1, steps + 1):
        x, y = corpus.batch("train", step, plan.target.batch_size, T, seed=plan.seed)
        out.append(torch.cat([x, y[:, -1:]], dim=1)[:B])
    return torch.stack(out).long()


def _has_dropout(model: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def reference_losses(model: torch.nn.Module, spec: OptimizerSpec, batches: torch.Tensor) -> list[float]:
    """hptransfer's training step on each batch, in one process in fp32: the loss before the step,
    then backward, global-norm clipping (if any), AdamW with the groups, the schedule. The large run
    does the same per step (train/plain.py), sharded over workers and micro-batches."""
    from hptransfer.models import lm_logits
    from hptransfer.models.build import lm_loss

    opt = build_adamw(model, spec)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, spec.lr_factor)
    model.train(not _has_dropout(model))  # dropout would make the losses a draw, not a reference
    losses = []
    for b in batches:
        loss = lm_loss(lm_logits(model, b[:, :-1]), b[:, 1:])
        losses.append(loss.item())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if spec.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
        opt.step()
        sched.step()
    return losses


def load_plan_arg(plan: Any):
    """A TransferPlan, a plan file or a study folder (its transfer_plan.yaml)."""
    from hptransfer.layout import PLAN_FILE
    from hptransfer.plan import TransferPlan, load_plan

    if isinstance(plan, TransferPlan):
        return plan
    path = Path(plan)
    return load_plan(path / PLAN_FILE if path.is_dir() else path)


def _readme(plan: Any, spec: OptimizerSpec, n: int, batch: int) -> str:
    return f"""# Hand-off of study `{plan.study}`: width {plan.target.width}, rule `{plan.rule}`

Written by hptransfer; nothing here needs hptransfer.

- `model/`: the target at step 0. `AutoModelForCausalLM.from_pretrained("model")`.
- `optimizer.json`: AdamW (lr {spec.lr:.6g}, betas {list(spec.betas)}, eps {spec.eps:g}, weight_decay {spec.weight_decay:g},
  grad_clip {spec.grad_clip:g}) and {len(spec.param_groups)} parameter groups. A parameter takes the first group whose
  `pattern` matches its name with `re.fullmatch`; it trains at lr × lr_mult, weight_decay × wd_mult, eps × eps_mult.
  The schedule is `transformers.get_cosine_with_min_lr_schedule_with_warmup(opt, warmup_steps, total_steps,
  min_lr_rate=min_lr_rate)`.
- `conformance/`: {n} batches of {batch} sequences and the loss hptransfer's trainer reaches on each. Train on them and
  compare: every step should agree within 1e-4 relative.
- `trainers/`: the same groups for torchtitan, Megatron-core, HF `Trainer` and DeepSpeed.

```python
import json, re, torch
from transformers import AutoModelForCausalLM, get_cosine_with_min_lr_schedule_with_warmup

model = AutoModelForCausalLM.from_pretrained("model")
o = json.load(open("optimizer.json"))
groups = [dict(params=[], lr=o["lr"] * g["lr_mult"], weight_decay=o["weight_decay"] * g["wd_mult"], eps=o["eps"] * g["eps_mult"])
          for g in o["param_groups"]]
for name, p in model.named_parameters():
    groups[next(i for i, g in enumerate(o["param_groups"]) if re.fullmatch(g["pattern"], name))]["params"].append(p)
opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=o["lr"], betas=o["betas"], eps=o["eps"])
s = o["schedule"]
sched = get_cosine_with_min_lr_schedule_with_warmup(opt, s["warmup_steps"], s["total_steps"], min_lr_rate=s["min_lr_rate"])
for batch, want in zip(torch.load("conformance/batches.pt"), json.load(open("conformance/losses.json"))["train_loss"]):
    logits = model(batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    print(loss.item(), want)
    opt.zero_grad(); loss.backward()
    if o["grad_clip"] > 0: torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
    opt.step(); sched.step()
```
""" + ("\nNotes:\n" + "".join(f"- {t}\n" for t in spec.notes) if spec.notes else "")


def write_handoff(
    plan: Any,
    out: str | Path,
    *,
    steps: int = DEFAULT_STEPS,
    batch_size: int | None = None,
    force: bool = False,
    trainers: bool = True,
) -> HandoffResult:
    """Write the hand-off folder `out` for `plan` (a TransferPlan, a plan file or a study folder)."""
    plan = load_plan_arg(plan)
    out = Path(out)
    problems = []
    if plan.rule == "dp":
        problems.append(Problem("rule", "a dp plan fine-tunes privately; there is no large-run hand-off for it", "dp"))
    if plan.model.family == "mlp":
        problems.append(
            Problem("model.family", "the byte MLP has no Hugging Face class to hand off", "mlp", "use family llama or hf")
        )
    if steps < 1:
        problems.append(Problem("--steps", "must be at least 1", steps))
    if batch_size is not None and not 1 <= batch_size <= plan.target.batch_size:
        problems.append(Problem("--batch-size", f"must be in 1..{plan.target.batch_size} (the target batch)", batch_size))
    if out.exists() and any(out.iterdir()) and not force:
        problems.append(
            Problem("--out", "exists and is not empty", str(out), "choose another folder or pass --force to replace it")
        )
    if problems:
        raise PlanError(str(out), problems)

    try:
        folded, spec = fold_plan_target(plan)
    except NotImplementedError as e:
        raise PlanError(str(out), [Problem("model", str(e))]) from None
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir(parents=True)
    try:
        from hptransfer.models.handoff import save_handoff

        save_handoff(
            folded.model,
            tmp / MODEL_DIR,
            spec_model=plan.model,
            width=plan.target.width,
            base_width=plan.base_width,
            plan_dict=plan.model_dump(mode="json"),
            folded=folded,
        )
        write_json(tmp / OPTIMIZER_FILE, spec.model_dump(mode="json"))
        batches = conformance_batches(plan, steps, batch_size)
        losses = reference_losses(copy.deepcopy(folded.model), spec, batches)
        (tmp / CONFORMANCE_DIR).mkdir()
        torch.save(batches, tmp / CONFORMANCE_DIR / BATCHES_FILE)
        write_json(
            tmp / CONFORMANCE_DIR / LOSSES_FILE,
            {
                "train_loss": losses,
                "how": "loss before each step (mean token cross-entropy of batch[:, 1:] given batch[:, :-1]) of AdamW with "
                "optimizer.json's groups and schedule, from model/, one process, fp32",
                "torch": torch.__version__,
            },
        )
        written: dict[str, Path] = {}
        notes = list(spec.notes)
        if trainers:
            written, trainer_notes = _trainer_files(tmp, spec)
            notes += trainer_notes
        write_atomic(tmp / "README.md", _readme(plan, spec, len(batches), batches.shape[1]))
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return HandoffResult(
        out=out, optimizer=spec, losses=losses, trainers={k: out / v.relative_to(tmp) for k, v in written.items()}, notes=notes
    )


def _trainer_files(tmp: Path, spec: OptimizerSpec) -> tuple[dict[str, Path], list[str]]:
    try:
        from hptransfer.handoff.trainers import write_trainer_files
    except ImportError:  # the per-trainer writers are optional
        return {}, []
    res = write_trainer_files(tmp / TRAINERS_DIR, tmp / MODEL_DIR, spec.model_dump(mode="json"))
    if isinstance(res, tuple):
        return res[0], list(res[1])
    return res, []


def _replace_dir(new: Path, out: Path) -> None:
    """Move `new` into place at `out`; an existing `out` is swapped out first and removed after."""
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}-{time.time_ns()}"
        out.rename(old)
    new.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
