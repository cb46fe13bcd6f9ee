"""`dp_plan_for(config) -> DPPlan`: the DP rule applied to a `dp:` block, with its evidence.

The transfer engine's `dp` rule calls this; `hpt dp-plan` prints it. The plan carries the σ√T
table so a reader can see why B was chosen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from hptransfer.dp import rule
from hptransfer.dp.accounting import NoiseRow, epsilon_spent, noise_table
from hptransfer.dp.steps import LossModel
from hptransfer.errors import DPError
from hptransfer.privacy import DPConfig


class DPPlanError(DPError):
    """A request no plan can satisfy; `problems` lists every reason, each with its fix."""

    def __init__(self, problems: list[str]):
        super().__init__("infeasible DP plan", problems)


@dataclass(frozen=True)
class DPEvidence:
    """What the study measured, for the measured rules (all optional; absent → the unmeasured rule):
    - `loss_model`: L(T, ρ) fitted on the DP sweep (`dp.steps.fit_loss_model`), for batch_rule
      `predicted-loss`;
    - `lr_law`: (β, η_ref, B_ref) of the best LR against B (`dp.steps.fit_lr_law`);
    - `grad_norms` (+ optional `grad_labels`, a class per example): per-example gradient norms measured
      on PUBLIC data, for C(ε) and the re-weighting diagnostic.
    `source` says where they came from, for the plan's notes."""

    loss_model: LossModel | None = None
    lr_law: tuple[float, float, int] | None = None
    grad_norms: Sequence[float] | None = None
    grad_labels: Sequence | None = None
    source: str = ""


class DPPlan(BaseModel):
    """Batch size, noise, clipping grid and LR scaling for one (ε, δ, N, E)."""

    model_config = ConfigDict(frozen=True)

    config: DPConfig = Field(..., description="The dp block the plan was made from (dataset_size resolved).")
    table: list[NoiseRow] = Field(..., description="σ(B), T, σ√T and σ/B for every candidate B: the evidence.")
    batch_size: int = Field(..., description="Chosen expected batch size B (Poisson sampling at q = B/N).")
    sample_rate: float = Field(..., description="q = B/N.")
    steps: int = Field(..., description="T = ceil(E·N/B).")
    noise_multiplier: float = Field(..., description="σ at the chosen B (noise std = σ in the normalized form).")
    epsilon_check: float = Field(..., description="ε the accountant reports for (σ, q, T); ≤ config.epsilon.")
    clip_grid: list[float] = Field(..., description="Clipping bounds C to sweep: the base grid extended upward as ε falls.")
    clip: float = Field(
        ...,
        description=(
            "C for the run. With measured per-example gradient norms (clip_from: measured norms): their p(ε)-quantile, "
            "moving up as ε falls inside the measured distribution (rule.clip_from_norms). Without: clip_reference, NOT "
            "shifted (on the digits task the ×4-shifted C scored 0.36 vs 0.66 at ε=0.5, benchmarks/dp_directions.py). "
            "Sweep clip_grid, which is extended upward."
        ),
    )
    clip_shift: float = Field(..., description="(ε_ref/ε)^γ for ε < ε_ref, else 1.")
    lr_scale: float | None = Field(None, description="√(B/B_ref) when lr_reference_batch is set.")
    lr: float | None = Field(None, description="config.lr · lr_scale when lr is set.")
    notes: list[str] = Field(default_factory=list)
    # Added with the measured rules (issue 26); defaults are what plans written before them meant.
    batch_rule: str = Field("noise", description="The batch rule that chose B: `predicted-loss` or `noise` (σ√T).")
    predictions: list[dict] = Field(
        default_factory=list,
        description="batch_rule predicted-loss: per candidate B, step_loss + noise_penalty = predicted_loss.",
    )
    batch_decision: dict | None = Field(
        None,
        description=(
            "batch_rule predicted-loss: the σ√T choice (no step floor), the predicted best, the predicted gain and "
            "its bootstrap interval, and whether B moved (rule.choose_batch_size_predicted)."
        ),
    )
    loss_model: dict | None = Field(None, description="The fitted L(T, ρ) (dp.steps.LossModel.as_dict); null: none.")
    lr_law: dict | None = Field(None, description="Measured η*(B) = lr_ref·(B/batch_ref)^beta; null: not measured.")
    clip_from: str = Field(
        "clip_reference", description="`measured norms` (C = a quantile of them, rule.clip_from_norms) or `clip_reference`."
    )
    clip_quantile: float | None = Field(None, description="p(ε), the quantile of the measured norms C sits at.")
    clipped_fraction: float | None = Field(None, description="Share of the measured examples with ‖g‖ > C.")
    clip_reweighting: dict[str, float] | None = Field(
        None,
        description="Paper 1's diagnostic w_y(C) = mean over class/bucket y of min(1, C/‖g_i‖) on the measured norms.",
    )


def evidence_from_sweep(df, config: DPConfig, metric: str = "val_loss") -> DPEvidence:
    """The measured rules' evidence from a study's DP sweep table (`dp_sweep_results.csv`): the loss
    model fitted on its per-(ε, B) cells (noise-free ε = inf rows included) and the LR-vs-B law when
    it swept ≥ 2 LRs. A table too thin to fit gives no loss model (the plan then says it fell back)."""
    from hptransfer.dp.steps import best_lr_per_batch, fit_loss_model, fit_lr_law, step_points_from_table

    n = config.require_dataset_size()
    pts = step_points_from_table(df, config.epochs, n, metric)
    try:
        model = fit_loss_model(pts)
    except ValueError:
        model = None
    bs, lrs = best_lr_per_batch(df, metric)
    free = sum(1 for p in pts if p.epsilon is not None and p.epsilon == float("inf"))
    return DPEvidence(
        loss_model=model,
        lr_law=fit_lr_law(bs, lrs) if bs else None,
        source=f"DP sweep: {len(pts)} (ε, B) cells, {free} noise-free",
    )


def dp_plan_for(
    config: DPConfig, evidence: DPEvidence | None = None, sigma_of: Callable[[float, int], float | None] | None = None
) -> DPPlan:
    """Apply the DP rules to `config` (dataset_size must be set), using `evidence` where the rule is a
    measured one. `sigma_of(q, T)` may supply σ already computed for the config's (ε, δ, accountant)
    (e.g. a table kept between runs; `accounting.noise_row`); the plan's ε is still checked by the
    accountant. Raises DPPlanError if no batch size is feasible, listing why for each kind of failure."""
    ev = evidence or DPEvidence()
    n = config.require_dataset_size()
    rows = noise_table(
        config.epsilon,
        config.delta,
        n,
        config.epochs,
        config.resolved_batch_sizes(),
        config.min_steps,
        config.accountant,
        config.epsilon_tolerance,
        sigma_of,
    )
    predicted = config.batch_rule == "predicted-loss" and ev.loss_model is not None
    if not any(r.feasible for r in rows) and not (predicted and any(r.sigma is not None for r in rows)):
        raise DPPlanError(_why_infeasible(config, rows))
    preds: list[dict] = []
    decision: dict = {}
    if predicted:
        b, preds, decision = rule.choose_batch_size_predicted(rows, ev.loss_model, config.epochs, n, config.tolerance)
    else:
        b = rule.choose_batch_size(rows, config.tolerance)
    row = next(r for r in rows if r.batch_size == b)
    eps = epsilon_spent(row.sigma, row.sample_rate, row.steps, config.delta, config.accountant)
    # Internal invariant: get_noise_multiplier returns the upper end of its bracket.
    assert eps <= config.epsilon + 1e-9, (eps, config.epsilon)
    shift = rule.clip_shift(config.epsilon, config.clip_shift_reference_epsilon, config.clip_shift_exponent)
    grid = rule.clip_grid(
        config.epsilon,
        config.clip_reference,
        config.clip_factors,
        config.clip_shift_reference_epsilon,
        config.clip_shift_exponent,
    )
    scale = rule.lr_scale(config.lr_reference_batch, b) if config.lr_reference_batch else None
    lr = config.lr * scale if (config.lr and scale) else None
    best = min(r.sigma_sqrt_t for r in rows if r.sigma_sqrt_t is not None and (r.feasible or predicted))
    notes = []
    if predicted:
        m, p = ev.loss_model, next(x for x in preds if x["batch_size"] == b)
        notes.append(
            f"batch rule predicted-loss ({ev.source or 'measured'}): L = {m.l_inf:.4g} + {m.a:.4g}·T^-{m.alpha:g} + "
            f"{m.kappa:.4g}·(σ√T/(E·N))², rmse {m.rmse:.3g} on {m.n_points} cells; B={b}: {p['step_loss']:.4g} + "
            f"{p['noise_penalty']:.4g} = {p['predicted_loss']:.4g}"
            + (" (T outside the measured range)" if p["extrapolated"] else "")
        )
        notes.append(decision["why"])
        noise_b = rule.choose_batch_size(rows, config.tolerance) if any(r.feasible for r in rows) else None
        notes.append(
            f"the σ√T rule (batch_rule: noise, T ≥ min_steps={config.min_steps}) would choose B={noise_b}; "
            f"without the floor B={decision['sigma_sqrt_t_choice']}; min σ√T = {best:.3g}"
        )
    else:
        if config.batch_rule == "predicted-loss":
            notes.append(
                "batch rule predicted-loss needs a step curve measured by the study's DP sweep (none given): "
                "fell back to the σ√T rule; run `hpt dp-sweep` over several batch sizes, then re-plan"
            )
        notes.append(f"min σ√T over feasible B = {best:.3g}; chose the smallest B within {config.tolerance:.0%} of it")
    lr_law = None
    if ev.lr_law is not None:
        beta, lr_ref, b_ref = ev.lr_law
        lr_law = {"beta": beta, "lr_ref": lr_ref, "batch_ref": b_ref, "lr_at_b": lr_ref * (b / b_ref) ** beta}
        notes.append(f"measured LR law: η*(B) = {lr_ref:.4g}·(B/{b_ref})^{beta:.3g} → {lr_law['lr_at_b']:.4g} at B={b}")
    notes.append(
        f"clipping grid extended upward ×{shift:.3g} for ε={config.epsilon:g} "
        f"(ε_ref={config.clip_shift_reference_epsilon:g}, γ={config.clip_shift_exponent:g})"
    )
    clip, clip_from, q, frac, weights = config.clip_reference, "clip_reference", None, None, None
    if ev.grad_norms is not None and len(ev.grad_norms):
        args = (config.clip_quantile, config.clip_shift_reference_epsilon, config.clip_shift_exponent)
        q = rule.clip_quantile(config.epsilon, *args)
        clip, clip_from = rule.clip_from_norms(ev.grad_norms, config.epsilon, *args), "measured norms"
        frac = sum(g > clip for g in ev.grad_norms) / len(ev.grad_norms)
        labels = ev.grad_labels if ev.grad_labels is not None else rule.norm_buckets(ev.grad_norms)
        weights = rule.reweighting(ev.grad_norms, labels, clip)
        lo = min(weights, key=weights.get)
        notes.append(
            f"C = {clip:.4g}: the {q:.3f}-quantile of {len(ev.grad_norms)} measured per-example gradient norms "
            f"(q={config.clip_quantile:g} at ε ≥ {config.clip_shift_reference_epsilon:g}, moving up as ε falls); "
            f"{frac:.0%} clipped; most down-weighted class/bucket {lo!r}: w = {weights[lo]:.3g}"
        )
    skipped = [r.batch_size for r in rows if not r.feasible]
    if skipped:
        notes.append(f"infeasible B: {skipped} ({'; '.join(sorted({r.reason for r in rows if not r.feasible}))})")
    return DPPlan(
        config=config,
        table=rows,
        batch_size=b,
        sample_rate=row.sample_rate,
        steps=row.steps,
        noise_multiplier=row.sigma,
        epsilon_check=eps,
        clip_grid=grid,
        clip=clip,
        clip_shift=shift,
        lr_scale=scale,
        lr=lr,
        notes=notes,
        batch_rule="predicted-loss" if predicted else "noise",
        predictions=preds,
        batch_decision=decision if predicted else None,
        loss_model=ev.loss_model.as_dict() if predicted else None,
        lr_law=lr_law,
        clip_from=clip_from,
        clip_quantile=q,
        clipped_fraction=frac,
        clip_reweighting=weights,
    )


def _why_infeasible(config: DPConfig, rows: list[NoiseRow]) -> list[str]:
    out = []
    no_sigma = [r.batch_size for r in rows if r.sigma is None]
    short = [r for r in rows if r.sigma is not None and not r.feasible]
    if no_sigma:
        out.append(
            f"epsilon={config.epsilon:g}: no noise multiplier σ ≤ 1e6 meets (ε, δ={config.delta:g}) at B={no_sigma}; "
            "raise epsilon, lower epochs, or use smaller batch sizes (more privacy amplification)"
        )
    if short:
        tmax = max(r.steps for r in rows)
        out.append(
            f"min_steps={config.min_steps} exceeds every T = ceil(E·N/B) with a valid σ (largest T = {tmax}); "
            f"lower min_steps, raise epochs, or add smaller batch sizes"
        )
    return out
