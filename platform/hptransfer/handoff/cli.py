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
    register: Optional[str] = typer.Option(
        None,
        "--register",
        metavar="NAME",
        help="Check the folder with a plain torch + transformers loop (its losses must match losses.json within "
        "1e-4), log it to the study's MLflow store and register it as a new version of model NAME.",
    ),
    tracking_uri: Optional[str] = typer.Option(
        None,
        "--tracking-uri",
        help="MLflow store for --register. Default: the study's (its spec's tracking.uri, else $MLFLOW_TRACKING_URI, "
        "else sqlite:///<plan's folder>/mlflow.db).",
    ),
) -> None:
    """Hand the plan's target to any trainer: the step-0 model as plain Hugging Face weights (µP's
    multipliers folded in), optimizer.json with per-parameter LR / weight-decay / ε multipliers, and
    conformance batches with hptransfer's losses to check your trainer against (see DIR/README.md)."""
    from hptransfer import logs
    from hptransfer.context import StudyContext
    from hptransfer.env import configure
    from hptransfer.handoff.write import load_plan_arg, write_handoff
    from hptransfer.layout import PLAN_FILE

    configure()
    plan_file = plan / PLAN_FILE if plan.is_dir() else plan
    load_plan_arg(plan_file)  # a bad plan is refused before anything is written or logged
    # The libraries' warnings (DeepSpeed's accelerator line, torchtitan's and Megatron's import notes)
    # go to the study's log file, as for every other verb; the console shows ours.
    log_file = logs.attach(StudyContext.for_plan(plan_file).paths.log_file)
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
    if register:
        from hptransfer.handoff.register import register_handoff

        console.print("checking the folder with a plain torch + transformers loop before registering it …")
        reg = register_handoff(res.out, plan_file, register, tracking_uri=tracking_uri)
        console.print(
            f"registered [bold]{escape(reg.name)}[/] version {reg.version} (run {reg.run_id}; consumer matches "
            f"losses.json to {reg.max_rel_error:.2g}; plan sha256 {reg.plan_sha256[:12]}…); "
            f"load it with mlflow.artifacts.download_artifacts('models:/{escape(reg.name)}/{reg.version}')"
        )
    console.print(f"[dim]library messages: {escape(str(log_file))}[/]")
