"""`hpt transfer` and `hpt export`: thin Typer wrappers over engine.py and exports.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from hptransfer.console import console, fail, user_errors
from hptransfer.plan_diagnostics import OptimumSummary
from hptransfer.spec import RULE_NAMES

# engine (pandas, scipy) and plan are imported inside the commands so `hpt --help` answers at once.


def _g(x, fmt: str = ".4g") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def print_plan(plan, path: Path | None = None) -> None:
    """The diagnostics a user reads before trusting the plan."""
    d = plan.diagnostics
    tuned = d.tuned
    t = Table(title=escape(f"optimum by width — study {plan.study}, rule {plan.rule}"))
    t.add_column("width", justify="right")
    t.add_column("best loss", justify="right")
    for hp in tuned:
        t.add_column(f"{hp}*", justify="right")
    t.add_column("trials", justify="left")
    t.add_column("flags")
    for w, per in d.optimum_by_width.items():
        cells, flags = [], []
        for hp in tuned:
            f = per.get(hp) or OptimumSummary()
            se = f"  ×÷{math.exp(f.log_se):.2f}" if f.log_se else ""
            cells.append(f"{_g(f.value)}{se}")
            if f.on_edge:
                flags.append(f"{hp} on grid edge")
            elif not f.convex:
                flags.append(f"{hp} not convex")
            if f.capped_by_divergence:
                flags.append(f"{hp} capped by divergence")
        joint = d.joint_by_width.get(w)
        if joint is not None:  # scattered points: one joint fit per width (transfer/joint.py)
            flags.append("joint fit" if joint.fallback is None else "joint fit fell back to the best point")
        trials = ", ".join(f"{k} {v}" for k, v in d.trials_by_width.get(w, {}).items())
        best = (per.get(d.primary or tuned[0]) or OptimumSummary()).best_loss if tuned else None
        t.add_row(str(w), _g(best), *cells, trials, "[yellow]" + "; ".join(flags) + "[/]" if flags else "")
    console.print(t)

    s = Table(
        title=f"target width {plan.target.width}, {plan.target.steps} steps, batch {plan.target.batch_size}", show_header=False
    )
    s.add_column("", style="bold")
    s.add_column("")
    for k, v in plan.hyperparameters.items():
        s.add_row(k, _g(v))
    if plan.param_group_multipliers.get("hidden_matrices"):
        g = plan.param_group_multipliers["hidden_matrices"]
        s.add_row("µP hidden matrices", f"lr × {g['lr']:.4g}, weight_decay × {g['weight_decay']:.4g} (MuAdamW)")
    lf, dr = d.loss_fit, d.drift_fit
    if lf:
        s.add_row("loss law", f"φ*_n = {_g(lf.phi_inf)} + {_g(lf.A, '.3g')}·n^−{_g(lf.alpha, '.3g')}")
    if dr:
        s.add_row(
            "optimum drift",
            "none across the ladder"
            if dr.drift == "none"
            else (
                f"|Δlog {d.primary}*| = {_g(dr.B, '.3g')}·n^−{dr.beta:.3g}"
                if dr.beta is not None
                else f"unknown ({dr.why or ''})"
            ),
        )
    fast = d.fast_transfer
    s.add_row(
        "fast transfer (β > α/2)",
        {True: "[green]yes[/]", False: "[red]no[/]", None: "not judged"}.get(fast, "[yellow]undecided[/]")
        + (f"  ({escape(d.fast_transfer_test)})" if d.fast_transfer_test else ""),
    )
    s.add_row("predicted transfer penalty", _g(d.predicted_penalty) + " (loss)")
    s.add_row("predicted target loss", _g(d.predicted_target_loss))
    for name in ("deepseek", "step_law"):
        b = plan.baselines.get(name)
        if b:
            s.add_row(f"{name} baseline lr", f"{b['lr']:.3g} (plan/baseline {_g(b.get('plan_lr_ratio'), '.3g')})")
    fp = plan.baselines.get("formula_prior")
    if fp and fp.get("lr") is not None:
        s.add_row(
            "lr: ladder · formula → plan",
            f"{fp['ladder_lr']:.4g} (σ {fp['ladder_log_sd']:.2g}) · {fp['formula']} (σ {fp['formula_log_sd']:.2g}) → "
            f"{fp['lr']:.4g} (weight {fp['weight_ladder']:.2f} on the ladder)",
        )
    for axis, law in ((plan.axes or {}).get("laws") or {}).items():
        ci = law.get("exponent_ci")
        s.add_row(
            f"{axis} law",
            f"lr ∝ {axis}^{law['exponent']:+.3g}"
            + (f" [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci else "")
            + f" ({law['verdict']}); {law['base']} → {law['target']}: lr × {law['factor']:.3g}",
        )
    cb = (plan.axes or {}).get("critical_batch")
    if cb:
        s.add_row("critical batch", f"B_simple ≈ {cb['b_simple']:.3g} sequences")
    for h in plan.heuristics:
        s.add_row("heuristic", f"{h['name']}: {h['applies_to']} × {h['factor']:.4g} ({h['why']})")
    if plan.schedule and plan.schedule.get("kind") == "sp-warmup":
        s.add_row(
            "multiplicative warmup",
            f"{plan.schedule['kind']}: m={plan.schedule['m']:.4g}, timescale={plan.schedule['timescale']:.4g} steps",
        )
    console.print(s)
    for n in d.notes:
        console.print(f"[dim]note:[/] {escape(str(n))}")
    for w in d.warnings:
        console.print(f"[yellow]warning:[/] {escape(str(w))}")
    if path is not None:
        console.print(f"plan written to [bold]{escape(str(path))}[/]")


@user_errors
def transfer(
    study_dir: Optional[Path] = typer.Option(
        None, "--study-dir", help="Study folder: reads spec.yaml and sweep_results.csv, writes transfer_plan.yaml."
    ),
    results: Optional[Path] = typer.Option(
        None,
        "--results",
        help="Standalone: a results table (.csv or .parquet) from any tool; columns width, val_loss, status, seed and one per tuned hyperparameter (a grid, or scattered points from any searcher: their joint optimum is fitted); optional steps, batch_size, depth (arms beyond the width ladder: their LR laws move the plan to the target's).",
    ),
    rule: Optional[str] = typer.Option(None, "--rule", help=f"Standalone: the transfer rule, one of {sorted(RULE_NAMES)}."),
    target_width: Optional[int] = typer.Option(None, "--target-width", help="Standalone: width of the large model."),
    base_width: Optional[int] = typer.Option(
        None, "--base-width", help="µP base width. Default: the narrowest width in the table."
    ),
    proxy_steps: int = typer.Option(100, "--proxy-steps", help="Standalone: steps each sweep trial ran."),
    proxy_batch_size: int = typer.Option(16, "--proxy-batch-size", help="Standalone: batch (sequences) of each sweep trial."),
    target_steps: Optional[int] = typer.Option(None, "--target-steps", help="Steps of the large run. Default: --proxy-steps."),
    target_batch_size: Optional[int] = typer.Option(
        None, "--target-batch-size", help="Batch of the large run. Default: --proxy-batch-size."
    ),
    target_depth: Optional[int] = typer.Option(
        None, "--target-depth", help="Blocks of the large model. Default: the ladder's depth (--depth, or the table's)."
    ),
    family: str = typer.Option("llama", "--family", help="Model family: llama or mlp."),
    depth: int = typer.Option(2, "--depth", help="Transformer blocks / hidden layers."),
    head_dim: int = typer.Option(16, "--head-dim", help="llama head size; widths must be multiples of it."),
    seq_len: int = typer.Option(64, "--seq-len", help="Context length."),
    parametrization: str = typer.Option("mup", "--parametrization", help="mup or sp."),
    formula_prior: str = typer.Option(
        "step_law",
        "--formula-prior",
        help="Standalone, llama: the free formula whose LR is the prior of the ladder's (step_law, deepseek), or none "
        "for the ladder's estimate alone (transfer.formula_prior; docs/RESEARCH.md).",
    ),
    formula_log_sd: float = typer.Option(
        0.693,
        "--formula-log-sd",
        help="Standalone: the formula's error σ_F in log η (0.693: a factor 2 at one σ; an assumption).",
    ),
    out: Optional[Path] = typer.Option(
        None, "--out", help="Plan file to write. Default: transfer_plan.yaml (in --study-dir when given)."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="Do not print the diagnostics table."),
) -> None:
    """Map the sweep's best hyperparameters to the target width; print the diagnostics; write the plan."""
    from hptransfer.layout import PLAN_FILE
    from hptransfer.pipeline import Study, transfer_stage
    from hptransfer.plan import save_plan
    from hptransfer.transfer.engine import file_hash, make_plan, read_results, standalone_spec

    if (study_dir is None) == (results is None):
        fail("give exactly one of --study-dir DIR (a study made by `hpt sweep`) or --results FILE (standalone)")
    if study_dir is not None:
        bad = [n for n, v in (("--rule", rule), ("--target-width", target_width)) if v is not None]
        if bad:
            fail(f"{', '.join(bad)} are for standalone use; with --study-dir edit {study_dir}/spec.yaml instead")
        study = Study.from_dir(study_dir)
        plan = transfer_stage(study, out=out)  # written once: to --out when given, else into the study folder
        path = Path(out) if out else study.paths.plan
    else:
        missing = [n for n, v in (("--rule", rule), ("--target-width", target_width)) if v is None]
        if missing:
            fail(f"standalone use needs {' and '.join(missing)}, e.g. --rule mup --target-width 1024")
        if rule not in RULE_NAMES:
            fail(f"--rule {rule!r} is unknown; choose one of {sorted(RULE_NAMES)}")
        table = read_results(results)
        spec = standalone_spec(
            table,
            rule=rule,
            target_width=target_width,
            base_width=base_width,
            proxy_steps=proxy_steps,
            proxy_batch_size=proxy_batch_size,
            target_steps=target_steps,
            target_batch_size=target_batch_size,
            target_depth=target_depth,
            model={
                "family": family,
                "depth": depth,
                "head_dim": head_dim,
                "seq_len": seq_len,
                "parametrization": parametrization,
            },
            transfer={"formula_prior": None if formula_prior == "none" else {"formula": formula_prior, "log_sd": formula_log_sd}},
            source=str(results),
        )
        plan = make_plan(spec, table, {"results_file": str(results), "results_file_hash": file_hash(results)})
        path = save_plan(plan, out or Path(PLAN_FILE))
    if not quiet:
        print_plan(plan, path)


@user_errors
def export(
    plan: Path = typer.Argument(..., help="A transfer_plan.yaml."),
    to: str = typer.Option(..., "--to", help="deepspeed | hf | torchtitan"),
    out: Optional[Path] = typer.Option(
        None, "--out", help="File to write. Default: beside the plan, e.g. transfer_plan.deepspeed.json."
    ),
) -> None:
    """Write the plan as a DeepSpeed config, HF TrainingArguments JSON or torchtitan TOML (validated first)."""
    from hptransfer.plan import load_plan
    from hptransfer.transfer.exports import FORMATS, caveats, default_out, export_plan

    if to not in FORMATS:
        fail(f"--to {to!r} is unknown; choose one of {list(FORMATS)}")
    p = load_plan(plan)  # a PlanError names every bad field of a hand-edited plan
    target = out or default_out(plan, to)
    try:
        written = export_plan(p, to, target)
    except Exception as e:  # the framework's own validator refused it: say which and why
        fail(f"the {to} export did not pass {to}'s own validation: {type(e).__name__}: {e}")
    for c in caveats(p):
        console.print(f"[yellow]note:[/] {escape(c)}")
    console.print(f"{to} config written to [bold]{escape(str(written))}[/]")
