"""Transfer rules, registered by name. A rule is an object (`Rule`): what it changes in training
(µP's weight-decay scaling: spec.RULE_TRAINING, part of the sweep hash, so results trained one way
never feed a plan that assumes the other) and a pure function of the sweep evidence and the target
shape, which returns the target's hyperparameters, per-parameter-group multipliers, an optional
multiplicative warmup, and notes. No Ray, MLflow or DeepSpeed here.

Every rule honours the same contract (tests/test_transfer_rules.py runs it over `RULES`):
- a target width that was swept gets that width's own optimum (evidence beats transfer), so a
  target equal to the base width is the identity;
- a target batch/steps different from the proxy's goes through `heuristics.py`, recorded as such.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hptransfer.hyperparameters import DEFAULT_HPS, LOG_SCALE
from hptransfer.spec import RULE_TRAINING, RuleTraining, WeightDecayScaling
from hptransfer.transfer.fitting import fit_log_linear_censored, interval_quantile
from hptransfer.transfer.heuristics import adjust_for_batch_and_steps
from hptransfer.transfer.schedule import default_timescale, steps_to_half


@dataclass(frozen=True)
class Evidence:
    """What a rule may look at: the per-width optima of the tuned hyperparameters."""

    optima: dict[int, dict[str, float]]  # width -> {hp: optimum}
    fixed: dict[str, float]  # hyperparameters held fixed in the sweep
    base_width: int
    parametrization: str
    log_se: dict[int, dict[str, float | None]] = field(default_factory=dict)  # std of log ν* (optimum.py)
    # "upper"/"lower" where the optimum is a bound (grid edge, capped by divergence): kept out of trends
    censored: dict[int, dict[str, str | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class Target:
    width: int
    steps: int
    batch_size: int
    proxy_steps: int
    proxy_batch_size: int
    warmup_timescale: float | None = None  # sp-warmup τ in steps; None: 1/(ηλ)
    dp: Any = None  # the spec's DPConfig, for the `dp` rule
    dp_evidence: Any = None  # dp.plan.DPEvidence from the study's DP sweep (measured B and LR rules)


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
    # A rule that chooses the target's batch size and steps itself (`dp`: B and T from the privacy
    # budget) sets these; the plan's `target` then carries them instead of the spec's.
    target_batch_size: int | None = None
    target_steps: int | None = None


RuleFunction = Callable[[Evidence, Target], RuleResult]


@dataclass(frozen=True)
class Rule:
    """A registered transfer rule: its name, what it changes in training (sweep trials and the large
    run: spec.RULE_TRAINING) and its pure map from evidence and target to the plan's values."""

    name: str
    apply: RuleFunction
    training: RuleTraining

    def __call__(self, ev: Evidence, target: Target) -> RuleResult:
        return self.apply(ev, target)


RULES: dict[str, Rule] = {}


def register(name: str):
    # What a rule changes in training is declared in the spec's RULE_TRAINING (the trainer and the
    # sweep hash read it there, below the engine); a rule without an entry is a programming error.
    assert name in RULE_TRAINING, f"add rule {name!r} to hptransfer.spec.RULE_TRAINING (what it changes in training)"

    def deco(fn: RuleFunction) -> RuleFunction:
        RULES[name] = Rule(name, fn, RULE_TRAINING[name])
        return fn

    return deco


# --- shared pieces -------------------------------------------------------------------------------


def source_width(ev: Evidence, target: Target) -> int:
    """The target's own width when it was swept, else the widest swept width (closest to it)."""
    return target.width if target.width in ev.optima else max(ev.optima)


def base_hps(ev: Evidence, width: int) -> dict[str, float]:
    return {**DEFAULT_HPS, **ev.fixed, **ev.optima[width]}


def group_multipliers(
    parametrization: str, m: float, weight_decay_scaling: WeightDecayScaling = "independent"
) -> dict[str, dict[str, float]]:
    """Per-parameter-group factors on the plan's lr / weight_decay at width_mult m = width/base.

    µP with Adam (Tensor Programs V, Table 3; `mup.MuAdamW`): matrix-like (hidden) weights get
    lr/m and — the "independent" form MuAdamW uses, paper 3 — weight decay ×m, so η·λ per group is
    width-independent (`standard` scaling: ×1, η·λ shrinks as 1/m). Vector-like ones (embeddings,
    norms, biases, the readout, whose only infinite dimension is fan_in) keep lr; MuReadout
    multiplies the readout's input by output_mult/m in the forward pass. SP: one global lr, all
    factors 1."""
    if parametrization != "mup":
        return {"all": {"lr": 1.0, "weight_decay": 1.0}}
    return {
        "hidden_matrices": {"lr": 1 / m, "weight_decay": m if weight_decay_scaling == "independent" else 1.0},
        "vectors_embeddings": {"lr": 1.0, "weight_decay": 1.0},
        "readout": {"lr": 1.0, "weight_decay": 1.0, "forward_multiplier": 1 / m},
    }


def _finish(
    ev: Evidence,
    target: Target,
    hps: dict[str, float],
    src: int,
    hold_product: bool,
    parametrization: str | None = None,
    weight_decay_scaling: WeightDecayScaling = "independent",
) -> RuleResult:
    hps, used = adjust_for_batch_and_steps(
        hps, target.proxy_batch_size, target.batch_size, target.proxy_steps, target.steps, hold_product
    )
    m = target.width / ev.base_width
    res = RuleResult(
        {k: float(v) for k, v in hps.items()},
        heuristics=used,
        source_width=src,
        param_group_multipliers=group_multipliers(parametrization or ev.parametrization, m, weight_decay_scaling),
    )
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
        res.warnings.append(
            "rule `mup` on a model that is not µP-parametrized: the optimum will drift "
            "with width; set model.parametrization: mup, or use rule `sp-warmup` or `power-law`"
        )
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
        res.warnings.append(
            "rule `mup-independent-wd` on a model that is not µP-parametrized; "
            "use rule `sp-warmup` for standard-parametrized models"
        )
    if base_hps(ev, src).get("weight_decay", 0.0) == 0:
        res.warnings.append("weight_decay is 0: holding η·λ constant does nothing; tune weight_decay or use `mup`")
    return res


@register("mup-standard-wd")
def mup_standard_wd_rule(ev: Evidence, target: Target) -> RuleResult:
    """µP with *standard* (coupled) weight decay: the variant paper 3 (Kosson et al., arXiv 2510.19093)
    compares against. Hidden matrices get lr/m as in µP but weight_decay ×1, so their η·λ shrinks as
    1/m with width; AdamW's equilibrium relative update ∝ √(ηλ) then falls with width and, late in
    training, the LR optimum drifts (the paper's finding). Same optimum carried over as `mup`, with
    plain lr/weight_decay heuristics for a new batch size (η·λ not held).
    `mup.MuAdamW` multiplies weight_decay by m for matrix-like parameters (the independent form),
    so the trainer must pass weight_decay/m for hidden matrices to get this rule's ×1 — which is
    what the hidden_matrices multiplier 1.0 states."""
    src = source_width(ev, target)
    scaling = RULE_TRAINING["mup-standard-wd"].weight_decay_scaling  # what its trials trained with: standard
    res = _finish(ev, target, base_hps(ev, src), src, hold_product=False, weight_decay_scaling=scaling)
    m = target.width / ev.base_width
    res.notes.append(
        f"standard (coupled) weight decay under µP: hidden matrices lr/m, weight_decay ×1 (m={m:.4g}), "
        "so η·λ shrinks as 1/m; a trainer using MuAdamW must divide the hidden matrices' weight_decay "
        "by m to undo MuAdamW's ×m"
    )
    if base_hps(ev, src).get("weight_decay", 0.0) == 0:
        res.warnings.append("weight_decay is 0: `mup-standard-wd` is then `mup`; tune weight_decay or use `mup`")
    if ev.parametrization != "mup":
        res.warnings.append(
            "rule `mup-standard-wd` on a model that is not µP-parametrized; set "
            "model.parametrization: mup, or use rule `sp-warmup` for standard-parametrized models"
        )
    return res


# sp-warmup: a timescale whose s_t reaches 1/√2 only after the run ends is capped to reach it at
# this fraction of the run. Assumption: the least departure from paper 3's τ that still lets the
# target train at (close to) its peak LR before it ends.
WARMUP_CAP_FRACTION = 1.0


@register("sp-warmup")
def sp_warmup_rule(ev: Evidence, target: Target) -> RuleResult:
    """Standard parametrization + independent weight decay + a width-dependent multiplicative
    warmup (paper 3, arXiv 2510.19093): keep the peak LR of the source width, hold η·λ constant,
    and multiply the usual schedule by s_t = (1 + (m² − 1)(1 − ηλ)^{2t})^{−1/2} with m the width
    ratio target/source (schedule.py), which reproduces the implicit warmup µP would give.
    s_t = 1/√2 after τ·ln(m² − 1)/2 steps; when that is longer than the run, τ is capped so it
    happens at WARMUP_CAP_FRACTION of the run (with a warning): otherwise the target would train at
    a reduced LR throughout."""
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
            res.warnings.append(
                "sp-warmup needs weight_decay > 0 for its timescale 1/(ηλ); "
                "fell back to reaching 1/√2 at 10% of the run — tune weight_decay or set the timescale"
            )
    res.schedule = {
        "kind": "sp-warmup",
        "m": m,
        "eta_lambda": eta_lambda,
        "timescale": tau,
        "timescale_source": how,
        "steps_to_half": steps_to_half(m, tau),
        "formula": "s_t = (1 + (m^2 - 1) * exp(-2 t / timescale))^(-1/2)",
    }
    half = steps_to_half(m, tau)
    if m * m > 2 and half > WARMUP_CAP_FRACTION * target.steps:
        capped = 2 * WARMUP_CAP_FRACTION * target.steps / math.log(m * m - 1)
        res.schedule.update(
            timescale=capped, timescale_uncapped=tau, timescale_source=f"{how}, capped", steps_to_half=steps_to_half(m, capped)
        )
        res.warnings.append(
            f"sp-warmup: with timescale {tau:.4g} s_t would reach 1/√2 only after {half:.0f} steps, "
            f"longer than the run ({target.steps}); capped the timescale to {capped:.4g} so it does at "
            f"step {steps_to_half(m, capped):.0f} — set transfer.warmup_timescale or raise weight_decay"
        )
    if ev.parametrization == "mup":
        res.warnings.append("rule `sp-warmup` on a µP model: µP already provides this warmup; use `mup-independent-wd`")
    return res


# power-law: a 95% prediction interval wider than ×/÷ this at the target makes its midpoint a guess.
MAX_EXTRAPOLATION_FACTOR = 2.0


@register("power-law")
def power_law_rule(ev: Evidence, target: Target) -> RuleResult:
    """Fit log ν*(n) = a + b·log n over the ladder's optima (censored ones as bounds) (weighted by their errors
    when every width has one; optimum.py) and extrapolate to the target width. For when the optimum
    still drifts with width (a non-µP model, or µP with slow transfer: paper 2, arXiv 2512.22768,
    recommends extrapolating ν*(n) then). Only log-scale hyperparameters are extrapolated; others
    come from the source width. Assumption: the power law holds beyond the ladder.

    Guards (issue 12, item 7):
    - censored optima (grid edge, capped by divergence) enter the fit as bounds (a censored
      likelihood: fitting.fit_log_linear_censored), not as points;
    - extrapolate only with ≥ 3 uncensored widths and a significant slope, |b|/b_se > 2; otherwise
      the widest uncensored optimum is used as is (µP's choice) and the notes say why;
    - the extrapolation is bounded by its prediction interval x̂ ± q·se (q: fitting's
      interval_quantile): when its half-width h exceeds log F (F = MAX_EXTRAPOLATION_FACTOR), the
      value moves from x̂ toward the widest uncensored optimum by the excess h − log F (never past
      it, never outside the interval), with a warning. At h = log F that is x̂ itself, so the guard
      is continuous: a clean drift whose interval is ×/÷2.03 moves by ×1.015, not to the interval's
      end (the earlier rule, which put a 1/width drift's 2^−13 at 2^−12, issue 37). As h grows the
      value reaches the interval's end nearest the widest optimum, the smallest move the evidence
      demands. Assumption: past that width the midpoint is a guess."""
    src = source_width(ev, target)
    hps = base_hps(ev, src)
    widths = sorted(ev.optima)
    notes, warnings = [], []
    if src != target.width:
        for hp in ev.optima[src]:
            if hp not in LOG_SCALE:
                continue
            value, note, warning = _extrapolate(ev, hp, widths, target.width)
            hps[hp] = value
            notes.append(note)
            warnings += [warning] if warning else []
        if target.width / max(widths) > 32:
            warnings.append(
                f"extrapolating the power law {target.width / max(widths):.0f}× beyond the widest swept width; add a wider proxy"
            )
    res = _finish(ev, target, hps, src, hold_product=False)
    if notes:
        res.notes[0] = f"log-scale hyperparameters extrapolated along the ladder; the others from swept width {src}"
    res.notes += notes
    res.warnings += warnings
    return res


def _extrapolate(ev: Evidence, hp: str, widths: list[int], target_width: int) -> tuple[float, str, str | None]:
    """(value at the target, note, warning or None) for one log-scale hyperparameter (power_law_rule).
    Censored optima enter as bounds (fitting.fit_log_linear_censored), once 3 widths are points."""
    kinds = [ev.censored.get(w, {}).get(hp) for w in widths]
    ok = [w for w, k in zip(widths, kinds) if not k]
    bounds = sorted(set(widths) - set(ok))
    as_bounds = f"; censored widths {bounds} as bounds" if bounds else ""
    if not ok:
        return (
            ev.optima[max(widths)][hp],
            f"{hp}: every optimum is censored (a bound): widest width's bound used",
            f"power-law: every {hp} optimum is on a grid edge or capped by divergence; extend sweep.grid.{hp}",
        )
    widest = ev.optima[max(ok)][hp]
    if len(ok) < 3:
        return (
            widest,
            f"{hp}: {len(ok)} uncensored widths, too few to fit a slope: widest uncensored optimum "
            f"{widest:.4g} (width {max(ok)}) used" + (f"; censored widths {bounds} are bounds only" if bounds else ""),
            None,
        )
    f = fit_log_linear_censored(
        widths, [math.log(ev.optima[w][hp]) for w in widths], [ev.log_se.get(w, {}).get(hp) for w in widths], kinds
    )
    fit_txt = f"log {hp}* = {f.a:.4g} {f.b:+.4g}(±{f.b_se:.2g})·log n over widths {ok}{as_bounds}"
    if not (f.b != 0 and (f.b_se == 0 or abs(f.b) / f.b_se > 2)):
        return (
            widest,
            f"{hp}: slope not significant ({fit_txt}): widest uncensored optimum {widest:.4g} (width {max(ok)}) used",
            None,
        )
    x_hat, half = f.predict(target_width), interval_quantile(f) * (f.predict_se(target_width) or 0.0)
    lo, hi = x_hat - half, x_hat + half
    if half <= math.log(MAX_EXTRAPOLATION_FACTOR):
        return (
            math.exp(x_hat),
            f"{hp}: {fit_txt} → {math.exp(x_hat):.4g} at width {target_width} "
            f"(95% interval {math.exp(lo):.4g}–{math.exp(hi):.4g})",
            None,
        )
    x_w = math.log(widest)
    toward = min(abs(x_hat - x_w), half - math.log(MAX_EXTRAPOLATION_FACTOR))
    x = x_hat - math.copysign(toward, x_hat - x_w)
    value = math.exp(min(max(x, lo), hi))
    return (
        value,
        f"{hp}: {fit_txt} → {math.exp(x_hat):.4g} at width {target_width}, but its 95% interval "
        f"{math.exp(lo):.4g}–{math.exp(hi):.4g} is wider than ×/÷{MAX_EXTRAPOLATION_FACTOR:g}: {value:.4g} used "
        f"(moved toward the widest uncensored optimum {widest:.4g} by the interval's excess, ×{math.exp(toward):.3g})",
        f"power-law: the extrapolated {hp} is uncertain by more than ×/÷{MAX_EXTRAPOLATION_FACTOR:g} at width "
        f"{target_width}; used the nearest end of its interval — add a wider proxy or seeds",
    )


@register("dp")
def dp_rule(ev: Evidence, target: Target) -> RuleResult:
    """DP fine-tuning (paper 1: Rehn et al., arXiv 2510.20616). Under a fixed epoch budget B sets both
    the steps T and the cumulative noise σ·√T. `dp.batch_rule: predicted-loss` (with the study's DP
    sweep as `target.dp_evidence`) takes the B of lowest predicted loss, step curve + noise penalty
    (dp.steps); `noise`, or no sweep to fit, the smallest feasible B whose σ√T is within the
    tolerance of the minimum. C: the p(ε)-quantile of measured norms when given, else the reference,
    with a grid shifted upward as ε falls. The plan's target batch size and steps ARE the DP choice
    (B, T): σ was computed for exactly that (q = B/N, T), so any other B or T would spend another ε.

    Learning rate, one value (the plan's `dp.lr_source` says which):
    - `dp.lr` given: an LR already tuned under DP at `dp.lr_reference_batch`, moved to B by paper 1's
      square-root rule η·√(B/B_ref);
    - else the DP sweep's measured law η*(B) = η_ref·(B/B_ref)^β when it swept ≥ 2 LRs (`dp-sweep`);
    - else the non-private sweep optimum of the source width × √(B/B_proxy) (Adam's √ rule, a
      heuristic across the private/non-private gap: a starting point for the DP LR search).
    The width transfer underneath is µP's: the widest swept optimum is used as is; warmup keeps its
    fraction of the run (T/T_proxy). The σ√T table is kept in the plan's `dp` section as the evidence."""
    from hptransfer.dp.plan import dp_plan_for

    if target.dp is None:
        raise ValueError("rule `dp` needs a `dp:` block in the spec (epsilon, delta, dataset_size, epochs)")
    dpp = dp_plan_for(target.dp, target.dp_evidence)
    src = source_width(ev, target)
    # Steps: the warmup keeps its fraction of the run (batch unchanged here: the LR is set below).
    hps, used = adjust_for_batch_and_steps(base_hps(ev, src), 1, 1, target.proxy_steps, dpp.steps, False)
    cfg = target.dp
    if cfg.lr is not None and cfg.lr_reference_batch is not None:
        source, from_lr, from_batch = "dp.lr", cfg.lr, cfg.lr_reference_batch
        why = f"dp.lr={cfg.lr:g} tuned under DP at B_ref={from_batch}, moved to B={dpp.batch_size}"
    elif dpp.lr_law is not None:  # measured by the DP sweep: its own law, not Adam's √ rule
        law = dpp.lr_law
        source, from_lr, from_batch = "dp-sweep", law["lr_ref"], law["batch_ref"]
        why = f"the DP sweep's best LR against B, η*(B) = {from_lr:.4g}·(B/{from_batch})^{law['beta']:.3g}"
    else:
        source, from_lr, from_batch = "sweep", hps["lr"], target.proxy_batch_size
        why = (
            f"no dp.lr: the non-private sweep optimum {from_lr:.4g} (width {src}, batch {from_batch}) moved to "
            f"B={dpp.batch_size}; set dp.lr and dp.lr_reference_batch to use an LR tuned under DP"
        )
    exponent = dpp.lr_law["beta"] if source == "dp-sweep" else 0.5
    scale = (dpp.batch_size / from_batch) ** exponent
    hps["lr"] = from_lr * scale
    res = RuleResult(
        {k: float(v) for k, v in hps.items()},
        source_width=src,
        heuristics=used,
        param_group_multipliers=group_multipliers(ev.parametrization, target.width / ev.base_width),
        target_batch_size=dpp.batch_size,
        target_steps=dpp.steps,
        notes=[
            f"DP: target B={dpp.batch_size} (q={dpp.sample_rate:.4g}) and T={dpp.steps} steps are the DP plan's "
            f"choice (not target.batch_size/steps), σ={dpp.noise_multiplier:.4g}, "
            f"C={dpp.clip:g} from the grid {[round(c, 4) for c in dpp.clip_grid]}",
            f"lr from {source}: {why}: lr = {from_lr:.4g} × ({dpp.batch_size}/{from_batch})^{exponent:.3g} = {hps['lr']:.4g}",
        ],
    )
    res.heuristics.append(
        {
            "name": "dp-lr-sqrt-batch",
            "kind": "heuristic",
            "factor": scale,
            "applies_to": "lr",
            "lr_source": source,
            "from_lr": from_lr,
            "from_batch": from_batch,
            "to_batch": dpp.batch_size,
            "exponent": exponent,
            "source": "the study's DP sweep (dp.steps.fit_lr_law)"
            if source == "dp-sweep"
            else "Malladi et al. 2022, arXiv 2205.10287; paper 1",
            "why": "measured: lr × (B′/B)^β" if source == "dp-sweep" else "Adam: lr × √(B′/B)",
        }
    )
    # One LR in the plan: the dp block's `lr` is the plan's, with where it came from.
    res.extras["dp"] = {
        **dpp.model_dump(mode="json"),
        "lr": hps["lr"],
        "lr_scale": scale,
        "lr_source": source,
        "lr_from": {"lr": from_lr, "batch_size": from_batch},
    }
    return res
