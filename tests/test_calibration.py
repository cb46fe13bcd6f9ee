"""Calibration of the verdicts and the predicted penalty on noisy synthetic sweeps with known truth.

Each scenario draws DRAWS sweeps (fixed RNG seeds: the rates are deterministic) from
    loss = φ*_n + κ·(log ν − log ν*(n))² + N(0, σ²),   φ*_n = 2 + 4·n^−0.5,  κ = 0.08,  σ = 0.02
on a ×√2 (or ×2) LR grid, fits every width (optimum.py, noise estimated from the seeds) and
diagnoses the ladder (diagnostics.py). "1/width drift" is ν*(n) ∝ 1/n: log ν* falls by log 2 per
doubling of width (slope −1, standard parametrization's classic Adam LR law). Issue 12's targets:
at σ = 0.02 with 5 widths × 3 seeds, false "drift" on a width-invariant optimum ≤ 10% and detection
of the 1/width drift ≥ 90%; with 3 widths × 1 seed, always undecided. `python tests/test_calibration.py`
prints the whole table.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import cache

import numpy as np
import pytest

from hptransfer.transfer.diagnostics import diagnose
from hptransfer.transfer.optimum import fit_optimum
from hptransfer.transfer.penalty import penalty_at_target
from hptransfer.transfer.rules import RULES, Evidence, Target
from hptransfer.transfer.synthetic import synthetic_trials, true_optimum

pytestmark = pytest.mark.slow  # 9 scenarios × 200 simulated ladders: ~30 s on 2 cores

DRAWS = 200
W5, W3 = (32, 64, 128, 256, 512), (32, 64, 128)
TARGET = 4096  # 8× the widest swept width
NU, KAPPA, NOISE = 3e-3, 0.08, 0.02

SCENARIOS = {  # name: (widths, seeds, drift power, grid ratio, diverge above (× ν*), RNG seed)
    "invariant, 5 widths x 3 seeds": (W5, 3, None, 2**0.5, None, 1),
    "1/width drift, 5 widths x 3 seeds": (W5, 3, -1.0, 2**0.5, None, 2),
    "n^-1/4 drift, 5 widths x 3 seeds": (W5, 3, -0.25, 2**0.5, None, 3),
    "invariant, 5 widths x 3 seeds, x2 grid": (W5, 3, None, 2.0, None, 4),
    "1/width drift, 5 widths x 3 seeds, x2 grid": (W5, 3, -1.0, 2.0, None, 5),
    "invariant, 5 widths x 3 seeds, diverges above 4 nu*": (W5, 3, None, 2**0.5, 4.0, 6),
    "invariant, 5 widths x 3 seeds, diverges just above nu*": (W5, 3, None, 2**0.5, 1.1, 7),
    "invariant, 3 widths x 1 seed": (W3, 1, None, 2**0.5, None, 8),
    "1/width drift, 3 widths x 1 seed": (W3, 1, -1.0, 2**0.5, None, 9),
}


PENALTY_RULES = {  # also price these rules' plans
    "1/width drift, 5 widths x 3 seeds": ("mup", "power-law"),
    "invariant, 5 widths x 3 seeds": ("mup",),
}


def _grid(ratio: float) -> np.ndarray:
    """Covers every ν*(n) of the scenarios (1e-4 … 1e-2 under the 1/width drift) with room each side."""
    return NU * ratio ** np.arange(math.floor(math.log(1 / 300) / math.log(ratio)), math.ceil(math.log(30) / math.log(ratio)) + 1)


def _penalty(rule: str, fits: dict, verdict: dict, power: float | None) -> tuple[float, float, float, float]:
    """(predicted mean, lo, hi, realized) for `rule`'s value at TARGET; realized = κ·(x_rule − x*)²."""
    ev = Evidence(
        optima={w: {"lr": f.value} for w, f in fits.items()},
        fixed={},
        base_width=32,
        parametrization="mup",
        log_se={w: {"lr": f.log_se} for w, f in fits.items()},
        censored={w: {"lr": f.censored} for w, f in fits.items()},
    )
    lr = RULES[rule](ev, Target(width=TARGET, steps=100, batch_size=16, proxy_steps=100, proxy_batch_size=16)).hyperparameters[
        "lr"
    ]
    d = penalty_at_target({w: {"lr": f} for w, f in fits.items()}, "lr", True, verdict, TARGET, lr)
    realized = KAPPA * (math.log(lr) - math.log(true_optimum(TARGET, NU, power=power, n0=64))) ** 2
    return d["predicted_penalty"], *d["predicted_penalty_interval"], realized


@cache
def simulate(name: str) -> dict:
    widths, seeds, power, ratio, diverge, rng_seed = SCENARIOS[name]
    penalty_rules = PENALTY_RULES.get(name, ())
    rng, grid = np.random.default_rng(rng_seed), _grid(ratio)
    drift, fast, pen = Counter(), Counter(), {r: [] for r in penalty_rules}
    for d in range(DRAWS):
        fits = {}
        for n in widths:
            above = None if diverge is None else diverge * true_optimum(n, NU, power=power, n0=64)
            v, loss, div = synthetic_trials(
                n, grid, nu_inf=NU, power=power, kappa=KAPPA, noise=NOISE, n_seeds=seeds, diverge_above=above, rng=rng
            )
            fits[n] = fit_optimum(v, loss, diverged=div, seed=d)
        out = diagnose(
            {w: {"lr": f} for w, f in fits.items()},
            ["lr"],
            {"lr"},
            "mup",
            "mup",
            max(widths),
            TARGET,
            {"lr": fits[max(widths)].value},
            seed=d,
        )
        drift[out.drift_verdict.verdict] += 1
        fast[str(out.fast_transfer)] += 1
        for r in penalty_rules:
            pen[r].append(_penalty(r, fits, out.drift_verdict.model_dump(), power))
    return {
        "drift": {k: v / DRAWS for k, v in drift.items()},
        "fast": {k: v / DRAWS for k, v in fast.items()},
        "penalty": {r: np.array(p) for r, p in pen.items()},
    }


def test_no_false_drift_on_a_width_invariant_optimum():
    r = simulate("invariant, 5 widths x 3 seeds")
    assert r["drift"].get("drift", 0) <= 0.10
    assert r["fast"].get("False", 0) <= 0.10  # nor a false "not fast"
    assert r["drift"].get("none", 0) >= 0.10  # and "none" is reachable, not abstention every time


def test_a_one_over_width_drift_is_detected():
    r = simulate("1/width drift, 5 widths x 3 seeds")
    assert r["drift"].get("drift", 0) >= 0.90
    assert r["fast"].get("True", 0) <= 0.05  # a drift that never settles is not called fast
    assert r["fast"].get("False", 0) >= 0.30  # and "not fast" is often decided outright


def test_a_coarser_grid_keeps_both_error_rates():
    assert simulate("invariant, 5 widths x 3 seeds, x2 grid")["drift"].get("drift", 0) <= 0.10
    assert simulate("1/width drift, 5 widths x 3 seeds, x2 grid")["drift"].get("drift", 0) >= 0.90


@pytest.mark.parametrize(
    "name", ["invariant, 5 widths x 3 seeds, diverges above 4 nu*", "invariant, 5 widths x 3 seeds, diverges just above nu*"]
)
def test_divergence_above_the_optimum_does_not_create_drift(name):
    """Just above ν* every width is capped (censored): too few usable widths, so undecided — the
    old engine called this drift with β = 4. Measured (200 draws): undecided in 199; in one draw a
    trend over few uncensored widths keeps its given errors (fitting.birge_scale: no Birge ratio from
    1–2 dof unless χ² is past its 95% quantile) and reads drift — well inside the 10% budget."""
    r = simulate(name)
    assert r["drift"].get("drift", 0) <= 0.10 and r["fast"].get("False", 0) <= 0.10
    if "just above" in name:
        assert r["drift"].get("undecided", 0) >= 0.99 and r["fast"].get("undecided", 0) >= 0.99, r


@pytest.mark.parametrize("name", ["invariant, 3 widths x 1 seed", "1/width drift, 3 widths x 1 seed"])
def test_three_widths_one_seed_always_abstain(name):
    r = simulate(name)
    assert r["drift"] == {"undecided": 1.0} and r["fast"] == {"undecided": 1.0}


@pytest.mark.parametrize("rule", ["mup", "power-law"])
def test_predicted_penalty_matches_the_realized_one(rule):
    """E[κ·(x_rule − x*)²] predicted vs realized over the draws of the 1/width drift at 8× beyond the
    ladder: `mup` carries the widest optimum (realized ≈ κ·(log 8)² ≈ 0.35); `power-law`
    extrapolates (realized ≈ κ·se², small but not 0). Mean within 2×; predictive interval covers."""
    pred, lo, hi, real = simulate("1/width drift, 5 widths x 3 seeds")["penalty"][rule].T
    assert 0.5 <= pred.mean() / real.mean() <= 2.0
    assert np.mean((lo <= real) & (real <= hi)) >= 0.85


def test_predicted_penalty_on_a_width_invariant_optimum_is_not_a_trend_extrapolation():
    """A width-invariant optimum, where the drift test mostly abstains (undecided): the realized
    penalty of `mup` is only the widest width's own estimation error (≈ 0.0008). Pricing the
    log-linear trend 8× beyond the ladder as if it were the truth predicted ~4× that; averaging it
    with the no-drift model by BIC weight (penalty_at_target) stays conservative, within 3×."""
    r = simulate("invariant, 5 widths x 3 seeds")
    assert r["drift"].get("undecided", 0) >= 0.5  # the case this is about
    pred, lo, hi, real = r["penalty"]["mup"].T
    assert 0.5 <= pred.mean() / real.mean() <= 3.0
    assert np.mean((lo <= real) & (real <= hi)) >= 0.85


def table() -> str:
    rows = ["| scenario | drift / none / undecided | fast True / False / undecided |", "|---|---|---|"]
    for name in SCENARIOS:
        r = simulate(name)
        d, f = r["drift"], r["fast"]
        rows.append(
            f"| {name} | {d.get('drift', 0):.3f} / {d.get('none', 0):.3f} / {d.get('undecided', 0):.3f} "
            f"| {f.get('True', 0):.3f} / {f.get('False', 0):.3f} / {f.get('undecided', 0):.3f} |"
        )
    for name in PENALTY_RULES:
        rows.append(
            f"\npredicted penalty, {name}, target {TARGET} ({DRAWS} draws): rule | mean predicted | "
            "mean realized | interval coverage"
        )
        for rule, p in simulate(name)["penalty"].items():
            pred, lo, hi, real = p.T
            rows.append(f"{rule} | {pred.mean():.4f} | {real.mean():.4f} | {np.mean((lo <= real) & (real <= hi)):.3f}")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
