"""`hpt handoff`: a thin Typer wrapper over handoff/write.py."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from hptransfer.console import console, user_errors


@user_errors
def handoff(
    plan: Path = typer.Argument(..., help="A transfer_plan.yaml, or a study folder holding one."),
    out: Path = typer.Option(..., "--out", help="Folder to write (model/, optimizer.json, conformance/, trainers/)."),
    steps: int = typer.Option(
        10, "--steps", help="Conformance steps: the target's first N batches and hptransfer's losses on them."
    ),
    batch_size: Optional[int] = typer.Option(
        None,
        "--batch-size",
        help="Sequences per conformance batch (the first ones of each target batch). Default: the target batch.",
    ),
    force: bool = typer.Option(False, "--force", help="Replace --out if it exists (the new folder is written first)."),
    no_trainers: bool = typer.Option(
        False, "--no-trainers", help="Skip the torchtitan / Megatron / HF Trainer / DeepSpeed files."
    ),
) -> None:
    """Hand the plan's target to any trainer: the step-0 model as plain Hugging Face weights (µP's
    multipliers folded in), optimizer.json with per-parameter LR / weight-decay / ε multipliers, and
    conformance batches with hptransfer's losses to check your trainer against (see DIR/README.md)."""
    from hptransfer.env import configure
    from hptransfer.handoff.write import write_handoff

    configure()
    res = write_handoff(plan, out, steps=steps, batch_size=batch_size, force=force, trainers=not no_trainers)
    spec = res.optimizer
    console.print(
        f"hand-off written to [bold]{escape(str(res.out))}[/]: {len(spec.param_groups)} parameter groups, "
        f"lr {spec.lr:.4g}, {len(res.losses)} conformance steps (loss {res.losses[0]:.4f} → {res.losses[-1]:.4f})"
    )
    for name, path in res.trainers.items():
        console.print(f"  {name}: {escape(str(path))}")
    for note in res.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
