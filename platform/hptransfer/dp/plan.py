"""`dp_plan_for(config) -> DPPlan`: the DP rule applied to a `dp:` block, with its evidence.

The transfer engine's `dp` rule calls this; `hpt dp-plan` prints it. The plan carries the σ√T
table so a reader can see why B was chosen.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hptransfer.dp import rule
from hptransfer.dp.accounting import NoiseRow, epsilon_spent, noise_table
from hptransfer.errors import DPError
from hptransfer.privacy import DPConfig


class DPPlanError(DPError):
    """A request no plan can satisfy; `problems` lists every reason, each with its fix."""

    def __init__(self, problems: list[str]):
        super().__init__("infeasible DP plan", problems)


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
        description="Starting C = clip_reference, NOT shifted: on the digits task the ×4-shifted C scored 0.36 vs 0.66 unshifted at ε=0.5 (benchmarks/dp_directions.py). Sweep clip_grid, which is extended upward.",
    )
    clip_shift: float = Field(..., description="(ε_ref/ε)^γ for ε < ε_ref, else 1.")
    lr_scale: float | None = Field(None, description="√(B/B_ref) when lr_reference_batch is set.")
    lr: float | None = Field(None, description="config.lr · lr_scale when lr is set.")
    notes: list[str] = Field(default_factory=list)


def dp_plan_for(config: DPConfig) -> DPPlan:
    """Apply paper 1's rules to `config` (dataset_size must be set). Raises DPPlanError if no
    batch size is feasible, listing why for each kind of failure."""
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
    )
    if not any(r.feasible for r in rows):
        raise DPPlanError(_why_infeasible(config, rows))
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
    best = min(r.sigma_sqrt_t for r in rows if r.feasible)
    notes = [
        f"min σ√T over feasible B = {best:.3g}; chose the smallest B within {config.tolerance:.0%} of it",
        f"clipping grid extended upward ×{shift:.3g} for ε={config.epsilon:g} "
        f"(ε_ref={config.clip_shift_reference_epsilon:g}, γ={config.clip_shift_exponent:g})",
    ]
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
        clip=config.clip_reference,
        clip_shift=shift,
        lr_scale=scale,
        lr=config.lr * scale if (config.lr and scale) else None,
        notes=notes,
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
