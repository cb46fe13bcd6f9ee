"""What the large run is checked against and the check itself: the loss law's interval at the
target width (made with the plan), and after training whether the target landed inside it and not
worse than its narrower ladder ("wider is better" at fixed hyperparameters, Tensor Programs V).
"""

from __future__ import annotations

import math

import numpy as np

from hptransfer.plan_diagnostics import Diagnostics
from hptransfer.transfer.fitting import P_GRID, power_design


def target_loss_interval(widths, losses, fits, target_width: int, n_boot: int = 200, seed: int = 0):
    """95% interval of the loss law's prediction at the target: redraw each width's best loss from
    its standard error (the measured noise / √seeds, floored at 0.5% of the loss — a fit to three
    exact points would otherwise claim certainty), refit, predict; the 2.5/97.5% quantiles of the
    refits that still fall with width. None when under half of them do."""
    rng = np.random.default_rng(seed)
    n, L = np.asarray(widths, float), np.asarray(losses, float)
    se = np.array([max(f.loss_se or 0.0, 0.005 * abs(loss)) for f, loss in zip(fits, L)])
    if len(n) < 3:
        return None
    # All redraws at once (same draws, row by row, as one at a time): the law profiled on P_GRID —
    # fit_loss_vs_width's bounded refinement of α moves a quantile by far less than its spread.
    Y = L + rng.normal(0, se, size=(n_boot, len(n)))
    _, pinv, R = power_design(tuple(float(v) for v in n))
    best = np.argmin((np.einsum("pjk,bk->bpj", R, Y) ** 2).sum(axis=2), axis=1)
    phi_inf, A = np.einsum("bk,bk->b", pinv[best, 0, :], Y), np.einsum("bk,bk->b", pinv[best, 1, :], Y)
    preds = (phi_inf + A * float(target_width) ** -P_GRID[best])[A > 0]  # a law only where loss falls with width
    if len(preds) < n_boot / 2:
        return None
    return [float(np.quantile(preds, 0.025)), float(np.quantile(preds, 0.975))]


def check_target(diagnostics: Diagnostics, measured: float | None) -> dict:
    """After the large run: is the target inside the predicted interval, and not worse than the
    best of its narrower ladder ("wider is better" at fixed hyperparameters, Tensor Programs V)?
    Returns {"verdict": "ok" | "worse than predicted" | "worse than the ladder" | "unchecked",
    "messages": [...]}; any verdict but ok/unchecked is a warning to show loudly."""
    if measured is None or not math.isfinite(measured):
        return {"verdict": "unchecked", "messages": ["the large run has no finite validation loss"]}
    msgs, verdict = [], "ok"
    interval, ladder = diagnostics.predicted_target_loss_interval, diagnostics.ladder_best_loss
    if interval is not None and None not in interval:
        lo, hi = interval
        if measured > hi:
            verdict = "worse than predicted"
            msgs.append(f"target val loss {measured:.4g} is above the predicted interval [{lo:.4g}, {hi:.4g}]")
        else:
            msgs.append(
                f"target val loss {measured:.4g} {'inside' if measured >= lo else 'below'} the predicted "
                f"interval [{lo:.4g}, {hi:.4g}]"
            )
    else:
        msgs.append("no predicted interval (needs ≥ 3 widths whose best loss falls with width)")
    if ladder is not None and measured > ladder:
        verdict = "worse than the ladder" if verdict == "ok" else verdict
        msgs.append(
            f"target val loss {measured:.4g} is WORSE than the ladder's best {ladder:.4g}: a wider model "
            "should not lose at the same horizon and hyperparameters (a short horizon, noise, or a transfer "
            "that did not hold — compare seeds before trusting the plan)"
        )
    return {"verdict": verdict, "messages": msgs}
