"""DP settings across width (dp/width.py) on synthetic DP sweep tables with known answers."""

import numpy as np
import pandas as pd
import pytest

from hptransfer.dp.width import best_cells, compare_widths, summary

CELLS = [(64, 1.0, 0.01), (64, 2.0, 0.01), (256, 1.0, 0.01), (256, 1.0, 0.03)]


def table(loss, seeds=(0, 1, 2, 3, 4), widths=(32, 64), eps=(2.0,)) -> pd.DataFrame:
    """One row per (width, ε, cell, seed) with val_loss = loss(width, ε, cell, seed)."""
    rows = [
        {
            "width": w,
            "epsilon": e,
            "batch_size": b,
            "clip": c,
            "lr": lr,
            "seed": s,
            "val_loss": loss(w, e, (b, c, lr), s),
            "status": "ok",
        }
        for w in widths
        for e in eps
        for b, c, lr in CELLS
        for s in seeds
    ]
    return pd.DataFrame(rows)


def noise(seed: int, cell, width: int, scale: float) -> float:
    return scale * np.random.default_rng([seed, width, *(int(x * 1000) for x in cell)]).standard_normal()


def test_same_best_cell_holds_and_the_best_is_the_lowest_seed_mean():
    base = {CELLS[0]: 3.0, CELLS[1]: 3.05, CELLS[2]: 2.9, CELLS[3]: 3.1}
    df = table(lambda w, e, c, s: base[c] - (0.2 if w == 64 else 0) + noise(s, c, w, 0.005))
    best = best_cells(df)
    assert [tuple(best.loc[i, ["batch_size", "clip", "lr"]]) for i in range(2)] == [CELLS[2], CELLS[2]]
    e = compare_widths(df)["per_epsilon"][0]
    assert e["verdict"] == "holds" and all(e["same"].values()) and e["difference"]["mean"] == 0.0


def test_a_narrow_choice_that_costs_clearly_more_at_the_wide_width_does_not_hold():
    # Narrow width: B=256 best. Wide width: B=64 C=2 best by 0.1; seed noise 0.005.
    narrow = {CELLS[0]: 3.0, CELLS[1]: 3.05, CELLS[2]: 2.9, CELLS[3]: 3.1}
    wide = {CELLS[0]: 2.75, CELLS[1]: 2.6, CELLS[2]: 2.7, CELLS[3]: 2.9}
    df = table(lambda w, e, c, s: (narrow if w == 32 else wide)[c] + noise(s, c, w, 0.005))
    check = compare_widths(df, tolerance=0.01)
    e = check["per_epsilon"][0]
    assert (check["narrow_width"], check["wide_width"]) == (32, 64)
    assert e["best"]["32"]["batch_size"] == 256 and e["best"]["64"]["clip"] == 2.0
    assert e["same"] == {"batch_size": False, "clip": False, "lr": True}
    d = e["difference"]
    assert d["lo"] > e["tolerance"] and abs(d["mean"] - 0.1) < 0.02 and d["seeds"] == 5
    assert e["verdict"] == "does not hold"
    assert "does not hold" in summary(check)


def test_a_different_cell_within_tolerance_holds_and_noise_is_inconclusive():
    narrow = {CELLS[0]: 3.0, CELLS[1]: 3.05, CELLS[2]: 2.9, CELLS[3]: 3.1}
    # Wide width: B=64 C=1 best, 0.0005 below the narrow width's choice (B=256), with a seed effect shared by cells.
    close = {CELLS[0]: 2.7, CELLS[1]: 2.8, CELLS[2]: 2.7005, CELLS[3]: 2.9}
    paired = table(lambda w, e, c, s: (narrow if w == 32 else close)[c] + (0.01 * s if w == 64 else 0))
    e = compare_widths(paired, tolerance=0.01)["per_epsilon"][0]
    assert not e["same"]["batch_size"] and e["verdict"] == "holds" and e["difference"]["hi"] <= e["tolerance"]
    # The same means with seed noise (sd 0.05) not shared by the cells: the interval straddles tol.
    noisy = table(lambda w, e, c, s: (narrow if w == 32 else close)[c] + noise(s, c, w, 0.05))
    e = compare_widths(noisy, tolerance=0.01)["per_epsilon"][0]
    # These seeds' noise (fixed generators) keeps each width's choice as in the means: the cells differ.
    assert e["best"]["32"]["batch_size"] == 256 and e["best"]["64"]["batch_size"] == 64 and not e["same"]["batch_size"]
    assert e["verdict"] == "inconclusive" and e["difference"]["lo"] < e["tolerance"] < e["difference"]["hi"]
    # ... and the interval is the paired t-interval over the 5 seeds, recomputed here with scipy.
    from scipy import stats

    def cell_loss(w, c):
        sel = noisy[(noisy.width == w) & (noisy.batch_size == c[0]) & (noisy["clip"] == c[1]) & (noisy.lr == c[2])]
        return sel.sort_values("seed").val_loss.to_numpy()

    d = cell_loss(64, CELLS[2]) - cell_loss(64, CELLS[0])  # the narrow width's choice minus the wide width's own best
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert (e["difference"]["mean"], e["difference"]["lo"], e["difference"]["hi"]) == pytest.approx((d.mean(), lo, hi), rel=1e-9)
    # One seed: no interval, so a different cell is inconclusive whatever the gap.
    one = table(lambda w, e, c, s: (narrow if w == 32 else close)[c], seeds=(0,))
    e = compare_widths(one)["per_epsilon"][0]
    assert e["verdict"] == "inconclusive" and e["difference"]["lo"] is None


def test_failed_trials_are_left_out_and_one_width_is_refused():
    base = {CELLS[0]: 3.0, CELLS[1]: 3.05, CELLS[2]: 2.9, CELLS[3]: 3.1}
    df = table(lambda w, e, c, s: base[c], eps=(2.0, float("inf")))
    df.loc[(df["width"] == 64) & (df["batch_size"] == 256) & (df["clip"] == 1.0) & (df["lr"] == 0.01), "status"] = "failed"
    check = compare_widths(df)
    assert [e["epsilon"] for e in check["per_epsilon"]] == [2.0, float("inf")]
    e = check["per_epsilon"][0]
    assert e["best"]["64"]["batch_size"] == 64 and e["verdict"] == "inconclusive" and "no ok trial" in e["why"]
    with pytest.raises(ValueError, match="≥ 2 widths"):
        compare_widths(df[df["width"] == 32])
