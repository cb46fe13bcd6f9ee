"""Transfer rules, registered by name. A rule is a pure function of the sweep evidence and the
target shape; it returns the target's hyperparameters, per-parameter-group multipliers, an optional
multiplicative warmup, and notes. No Ray, MLflow or DeepSpeed here.

Every rule honours the same contract (tests/test_transfer_rules.py runs it over `RULES`):
- a target width that was swept gets that width's own optimum (evidence beats transfer), so a
  target equal to the base width is the identity;
- a target batch/steps different from the proxy's goes through `heuristics.py`, recorded as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from hptransfer.spec import DEFAULT_HPS, LOG_SCALE
from hptransfer.transfer.diagnostics import fit_log_linear
from hptransfer.transfer.heuristics import adjust_for_batch_and_steps
from hptransfer.transfer.schedule import default_timescale, steps_to_half


@dataclass(frozen=True)
class Evidence:
    """What a rule may look at: the per-width optima of the tuned hyperparameters."""

    optima: dict[int, dict[str, float]]  # width -> {hp: optimum}
    fixed: dict[str, float]  # hyperparameters held fixed in the sweep
    base_width: int
    parametrization: str
    log_se: dict[int, dict[str, float | None]] = field(default_factory=dict)  # bootstrap std of log ν*


@dataclass(frozen=True)
class Target:
    width: int
    steps: int
    batch_size: int
    proxy_steps: int
    proxy_batch_size: int
    warmup_timescale: float | None = None  # sp-warmup τ in steps; None: 1/(ηλ)
    dp: Any = None  # the spec's DPConfig, for the `dp` rule


@dataclass
class RuleResult:
    hyperparameters: dict[str, float]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    param_group_multipliers: dict[str, dict[str, float]] = field(default_factory=dict)
    schedule: dict[str, Any] | None = None
    heuristics: list[dict] = field(default_factory=list)
    source_width: int | None = None  # the swept width whose optimum was carried over
    extras: dict[str, Any] = field(default_factory=dict)  # extra top-level plan sections (e.g. `dp`)


Rule = Callable[[Evidence, Target], RuleResult]
RULES: dict[str, Rule] = {}


def register(name: str):
    def deco(fn: Rule) -> Rule:
        RULES[name] = fn
        return fn

    return deco


# --- shared pieces -------------------------------------------------------------------------------

def source_width(ev: Evidence, target: Target) -> int:
    """The target's own width when it was swept, else the widest swept width (closest to it)."""
    return target.width if target.width in ev.optima else max(ev.optima)


def base_hps(ev: Evidence, width: int) -> dict[str, float]:
    return {**DEFAULT_HPS, **ev.fixed, **ev.optima[width]}


def group_multipliers(parametrization: str, m: float) -> dict[str, dict[str, float]]:
    """Per-parameter-group factors on the plan's lr / weight_decay at width_mult m = width/base.

    µP with Adam (Tensor Programs V, Table 3; `mup.MuAdamW`): matrix-like (hidden) weights get
    lr/m and — the "independent" form MuAdamW uses, paper 3 — weight decay ×m, so η·λ per group is
    width-independent. Vector-like ones (embeddings, norms, biases, the readout, whose only
    infinite dimension is fan_in) keep lr; MuReadout multiplies the readout's input by
    output_mult/m in the forward pass. SP: one global lr, all factors 1."""
    if parametrization != "mup":
        return {"all": {"lr": 1.0, "weight_decay": 1.0}}
    return {"hidden_matrices": {"lr": 1 / m, "weight_decay": m},
            "vectors_embeddings": {"lr": 1.0, "weight_decay": 1.0},
            "readout": {"lr": 1.0, "weight_decay": 1.0, "forward_multiplier": 1 / m}}


def _finish(ev: Evidence, target: Target, hps: dict[str, float], src: int, hold_product: bool,
            parametrization: str | None = None) -> RuleResult:
    hps, used = adjust_for_batch_and_steps(hps, target.proxy_batch_size, target.batch_size,
                                           target.proxy_steps, target.steps, hold_product)
    m = target.width / ev.base_width
    res = RuleResult({k: float(v) for k, v in hps.items()}, heuristics=used, source_width=src,
                     param_group_multipliers=group_multipliers(parametrization or ev.parametrization, m))
    res.notes.append(f"optimum taken from swept width {src}" + (" (the target width itself)" if src == target.width else ""))
    return res


# --- the rules -----------------------------------------------------------------------------------

@register("mup")
def mup_rule(ev: Evidence, target: Target) -> RuleResult:
    """µTransfer (Yang et al., Tensor Programs V, arXiv 2203.03466): under µP the optimum of the
    base-width hyperparameters is (approximately) width-independent, so the optimum at the widest
    swept width is used as is; µP's per-layer multipliers carry it to the target width.
    Assumption: the optimum has converged across the ladder (the diagnostics check it)."""
    src = source_width(ev, target)
    res = _finish(ev, target, base_hps(ev, src), src, hold_product=False)
    if ev.parametrization != "mup":
        res.warnings.append("rule `mup` on a model that is not µP-parametrized: the optimum will drift "
                            "with width; set model.parametrization: mup, or use rule `sp-warmup` or `power-law`")
    return res


@register("mup-independent-wd")
def mup_independent_wd_rule(ev: Evidence, target: Target) -> RuleResult:
    """µP with η·λ held constant per parameter group (paper 3: Kosson et al., arXiv 2510.19093).
    AdamW's equilibrium relative update is ‖ΔW‖/‖W‖ ∝ √(ηλ), so only the product matters late in
    training: widening by m, lr/m must come with λ·m (the group multipliers), and any other change
    of lr (a new batch size) moves λ the other way. Same optimum as `mup`."""
    src = source_width(ev, target)
    res = _finish(ev, target, base_hps(ev, src), src, hold_product=True)
    res.notes.append("η·λ held constant per parameter group (hidden matrices: lr/m, weight_decay·m)")
    if ev.parametrization != "mup":
        res.warnings.append("rule `mup-independent-wd` on a model that is not µP-parametrized; "
                            "use rule `sp-warmup` for standard-parametrized models")
    if base_hps(ev, src).get("weight_decay", 0.0) == 0:
        res.warnings.append("weight_decay is 0: holding η·λ constant does nothing; tune weight_decay or use `mup`")
    return res


@register("sp-warmup")
def sp_warmup_rule(ev: Evidence, target: Target) -> RuleResult:
    """Standard parametrization + independent weight decay + a width-dependent multiplicative
    warmup (paper 3, arXiv 2510.19093): keep the peak LR of the source width, hold η·λ constant,
    and multiply the usual schedule by s_t = (1 + (m² − 1)(1 − ηλ)^{2t})^{−1/2} with m the width
    ratio target/source (schedule.py), which reproduces the implicit warmup µP would give."""
    src = source_width(ev, target)
    res = _finish(ev, target, base_hps(ev, src), src, hold_product=True, parametrization="sp")
    hps = res.hyperparameters
    m = target.width / src
    eta_lambda = hps["lr"] * hps.get("weight_decay", 0.0)
    if target.warmup_timescale is not None:
        tau, how = float(target.warmup_timescale), "given"
    elif 0 < eta_lambda < 1:
        tau, how = default_timescale(eta_lambda), "-1/ln(1 - lr*weight_decay)"
    else:
        # No weight decay: the norm never settles, s_t would stay at 1/m. Assumption: let the
        # warmup reach 1/√2 at 10% of the run, and say so.
        tau = 2 * 0.1 * target.steps / math.log(m * m - 1) if m * m > 2 else float(target.steps)
        how = "fallback: half-way at 10% of target steps (weight_decay is 0)"
        if m > 1:
            res.warnings.append("sp-warmup needs weight_decay > 0 for its timescale 1/(ηλ); "
                                "fell back to reaching 1/√2 at 10% of the run — tune weight_decay or set the timescale")
    res.schedule = {"kind": "sp-warmup", "m": m, "eta_lambda": eta_lambda, "timescale": tau,
                    "timescale_source": how, "steps_to_half": steps_to_half(m, tau),
                    "formula": "s_t = (1 + (m^2 - 1) * exp(-2 t / timescale))^(-1/2)"}
    if m > 1 and steps_to_half(m, tau) > target.steps:
        res.warnings.append(f"sp-warmup: s_t reaches 1/√2 only after {steps_to_half(m, tau):.0f} steps, longer than "
                            f"the run ({target.steps}); the target would train at a reduced LR throughout")
    if ev.parametrization == "mup":
        res.warnings.append("rule `sp-warmup` on a µP model: µP already provides this warmup; use `mup-independent-wd`")
    return res


@register("power-law")
def power_law_rule(ev: Evidence, target: Target) -> RuleResult:
    """Fit log ν*(n) = a + b·log n over the ladder (weighted by the bootstrap errors when every
    width has one) and extrapolate to the target width. For when the optimum still drifts with
    width (a non-µP model, or µP with slow transfer: paper 2, arXiv 2512.22768, recommends
    extrapolating ν*(n) then). Only log-scale hyperparameters are extrapolated; others come from
    the source width. Assumption: the power law holds beyond the ladder."""
    src = source_width(ev, target)
    hps = base_hps(ev, src)
    widths = sorted(ev.optima)
    notes, warnings = [], []
    if src != target.width:
        for hp in ev.optima[src]:
            if hp not in LOG_SCALE:
                continue
            se = [ev.log_se.get(w, {}).get(hp) for w in widths]
            f = fit_log_linear(widths, [math.log(ev.optima[w][hp]) for w in widths], se)
            hps[hp] = math.exp(f.predict(target.width))
            pse = f.predict_se(target.width)
            notes.append(f"{hp}: log {hp}* = {f.a:.4g} {f.b:+.4g}·log n over widths {widths}"
                         + (f" (slope ± {f.b_se:.2g}; ×/÷ {math.exp(pse):.3g} at the target)" if pse else "")
                         + f" → {hps[hp]:.4g} at width {target.width}")
        if target.width / max(widths) > 32:
            warnings.append(f"extrapolating the power law {target.width / max(widths):.0f}× beyond the widest "
                            "swept width; add a wider proxy")
    res = _finish(ev, target, hps, src, hold_product=False)
    if notes:
        res.notes[0] = f"log-scale hyperparameters extrapolated along the ladder; the others from swept width {src}"
    res.notes += notes
    res.warnings += warnings
    return res


@register("dp")
def dp_rule(ev: Evidence, target: Target) -> RuleResult:
    """DP fine-tuning (paper 1: Rehn et al., arXiv 2510.20616). Under a fixed epoch budget the
    cumulative noise σ·√T decides: B is the smallest feasible batch whose σ√T is within the tolerance
    of the minimum (at tight ε σ√T plateaus, so small B costs no noise and buys steps); C comes from a
    grid shifted upward as ε falls; the swept LR moves with the batch as η·√(B′/B) (a heuristic, for
    Adam). The width transfer underneath is µP's: the widest swept optimum is used as is.
    The σ√T table is kept in the plan's `dp` section as the evidence."""
    from hptransfer.dp.plan import dp_plan_for

    if target.dp is None:
        raise ValueError("rule `dp` needs a `dp:` block in the spec (epsilon, delta, dataset_size, epochs)")
    dpp = dp_plan_for(target.dp)
    src = source_width(ev, target)
    hps = base_hps(ev, src)
    scale = math.sqrt(dpp.batch_size / target.proxy_batch_size)
    hps["lr"] = hps["lr"] * scale
    res = RuleResult(hps, source_width=src, notes=[
        f"DP: B={dpp.batch_size} (q={dpp.sample_rate:.4g}, T={dpp.steps}), σ={dpp.noise_multiplier:.4g}, "
        f"C grid {[round(c, 4) for c in dpp.clip_grid]}; lr × √(B/B_proxy) = ×{scale:.3g}"])
    res.heuristics.append({"name": "dp-lr-sqrt-batch", "factor": scale, "from_batch": target.proxy_batch_size,
                           "to_batch": dpp.batch_size, "note": "Adam: lr × √(B′/B), a heuristic (paper 1)"})
    res.extras["dp"] = dpp.model_dump(mode="json")
    return res
