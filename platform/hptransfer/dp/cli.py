"""`hpt dp-plan`: the batch size, noise, clipping grid and LR scaling for a DP budget (paper 1)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from hptransfer.console import user_errors

# CLI flag for each DPConfig field, so validation errors name what the user typed.
_FLAGS = {
    "epsilon": "--epsilon",
    "delta": "--delta",
    "dataset_size": "--dataset-size",
    "epochs": "--epochs",
    "batch_sizes": "--batch-sizes",
    "min_steps": "--min-steps",
    "tolerance": "--tolerance",
    "accountant": "--accountant",
}


def _parse_batch_sizes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise typer.BadParameter(
            f"expected comma-separated integers such as 256,1024,4096, got {text!r}", param_hint="--batch-sizes"
        ) from None


def _fail(problems: list) -> None:
    from hptransfer.errors import DPError, Problem

    out = []
    for p in map(str, problems):
        for field, flag in _FLAGS.items():  # name the flag the user typed, not the config field
            if p.startswith(f"{field}="):
                p = flag + p[len(field) :]
        out.append(Problem("", p))
    raise DPError("dp-plan", out)


@user_errors
def dp_plan(
    epsilon: Annotated[float, typer.Option(help="Target ε of the whole run (> 0).")],
    dataset_size: Annotated[int, typer.Option(help="N, private training examples.")],
    epochs: Annotated[float, typer.Option(help="E, the fixed epoch budget; T = ceil(E·N/B).")],
    delta: Annotated[float, typer.Option(help="Target δ (< 1/N).")] = 1e-5,
    batch_sizes: Annotated[
        str | None,
        typer.Option(help="Comma-separated B to consider, e.g. 256,1024,4096. Default: powers of two from 16, plus N."),
    ] = None,
    min_steps: Annotated[int, typer.Option(help="Feasible only if T ≥ this.")] = 20,
    tolerance: Annotated[float, typer.Option(help="Smallest B with σ√T within this fraction of the minimum.")] = 0.05,
    accountant: Annotated[str, typer.Option(help="prv (paper 1) or rdp.")] = "prv",
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON instead of a table.")] = False,
) -> None:
    """Choose B from cumulative DP noise σ√T under a fixed epoch budget, a clipping grid shifted up as
    ε falls, and the LR scaling √(B′/B) (Rehn et al., arXiv 2510.20616)."""
    from pydantic import ValidationError

    from hptransfer.dp.plan import DPPlanError, dp_plan_for
    from hptransfer.privacy import DPConfig

    raw = {
        "epsilon": epsilon,
        "delta": delta,
        "dataset_size": dataset_size,
        "epochs": epochs,
        "batch_sizes": _parse_batch_sizes(batch_sizes),
        "min_steps": min_steps,
        "tolerance": tolerance,
        "accountant": accountant,
    }
    try:
        cfg = DPConfig.model_validate(raw)
    except ValidationError as e:
        probs = []
        for err in e.errors():
            field = err["loc"][0] if err["loc"] else ""
            msg = err["msg"].removeprefix("Value error, ")
            probs.append(f"{_FLAGS.get(field, field)}={raw.get(field)!r}: {msg}" if field else msg)
        _fail(probs)
    try:
        plan = dp_plan_for(cfg)
    except DPPlanError as e:
        _fail([str(p) for p in e.problems])
    if as_json:
        typer.echo(json.dumps(plan.model_dump(mode="json"), indent=2))
        return
    _print_plan(plan)


def _print_plan(plan) -> None:
    from rich.console import Console
    from rich.table import Table

    c = plan.config
    t = Table(title=f"DP plan: ε={c.epsilon:g}, δ={c.delta:g}, N={c.dataset_size}, E={c.epochs:g}, accountant={c.accountant}")
    for col in ("B", "q = B/N", "T", "σ", "σ√T", "σ/B", ""):
        t.add_column(col, justify="right")
    for r in plan.table:
        f = lambda v, fmt: "—" if v is None else format(v, fmt)
        mark = "◀ chosen" if r.batch_size == plan.batch_size else ("" if r.feasible else r.reason)
        style = "bold green" if r.batch_size == plan.batch_size else (None if r.feasible else "dim")
        t.add_row(
            str(r.batch_size),
            f"{r.sample_rate:.4g}",
            str(r.steps),
            f(r.sigma, ".4g"),
            f(r.sigma_sqrt_t, ".4g"),
            f(r.sigma_over_b, ".3g"),
            mark,
            style=style,
        )
    con = Console()
    con.print(t)
    con.print(
        f"B = {plan.batch_size} (q = {plan.sample_rate:.4g}), T = {plan.steps}, σ = {plan.noise_multiplier:.4g}, "
        f"ε spent = {plan.epsilon_check:.4g} ≤ {c.epsilon:g}"
    )
    con.print(
        f"clipping grid C = {[float(f'{x:.3g}') for x in plan.clip_grid]} (base grid extended up to ×{plan.clip_shift:.3g}); "
        f"start at C = {plan.clip:.3g} (clip_reference)"
    )
    con.print(
        f"LR when moving from a tuned batch B to B′: η′ = η·√(B′/B); to B′={plan.batch_size}: η·{plan.batch_size**0.5:.3g}/√B"
    )
    for n in plan.notes:
        con.print(f"- {n}", style="dim", markup=False)
