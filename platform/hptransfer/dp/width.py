"""DP settings across width (issue 26 item 3): do the (B, C, lr) the DP sweep finds at the narrowest
width hold at the widest? Pure functions of the DP sweep tables of several widths.

Per ε and width, a cell is one (B, C, lr); its loss is the mean over seeds of `val_loss` (ok trials
only) and the width's choice is its lowest-mean cell. Under µP the LR is width-independent and B, C
are set by the privacy budget and the gradient-norm distribution, so the narrow width's choice is
meant to be usable at the wide width unchanged; this module measures whether it is.

The check, at the wide width: d_s = L_wide(narrow's cell, seed s) − L_wide(wide's own best cell, s),
paired by seed over the seeds both cells have. Its mean and 95% t-interval (≥ 2 seeds) say what
using the narrow width's choice costs there. Verdict, with tol = tolerance × the wide best's loss:
- `holds`: the narrow width chose the same cell, or the interval's upper end ≤ tol;
- `does not hold`: the interval's lower end > tol;
- `inconclusive`: otherwise (including one seed: no interval).
The wide width's best is picked on the same seeds it is scored on, so d is biased upward (a winner's
curse): the check leans toward `does not hold`, never toward `holds`. The narrow width's cell may be
missing at the wide width (a B infeasible there cannot happen: feasibility depends on ε, N, E only,
not on width; a failed trial can): then the verdict is `inconclusive` with the reason.
"""

from __future__ import annotations

import math

import pandas as pd

CELL = ["batch_size", "clip", "lr"]


def cell_means(df: pd.DataFrame) -> pd.DataFrame:
    """Mean, count of ok seeds per (width, ε, B, C, lr)."""
    ok = df[(df["status"] == "ok") & df["val_loss"].notna() & df["val_loss"].map(math.isfinite)]
    return ok.groupby(["width", "epsilon", *CELL])["val_loss"].agg(mean="mean", n="count").reset_index()


def best_cells(df: pd.DataFrame) -> pd.DataFrame:
    """Each (width, ε)'s lowest-mean cell (ties: the first in (B, C, lr) order)."""
    m = cell_means(df).sort_values(["width", "epsilon", "mean", *CELL], kind="stable")
    return m.groupby(["width", "epsilon"]).head(1).reset_index(drop=True)


def _t_interval(xs: list[float]) -> tuple[float, float | None, float | None]:
    from scipy.stats import t as student

    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None, None
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    half = float(student.ppf(0.975, len(xs) - 1)) * sd / math.sqrt(len(xs))
    return mean, mean - half, mean + half


def _cell(row) -> dict:
    return {"batch_size": int(row["batch_size"]), "clip": float(row["clip"]), "lr": float(row["lr"])}


def _losses(df: pd.DataFrame, width: int, eps: float, cell: dict) -> dict[int, float]:
    sel = df[
        (df["width"] == width)
        & (df["epsilon"] == eps)
        & (df["batch_size"] == cell["batch_size"])
        & (df["clip"] == cell["clip"])
        & (df["lr"] == cell["lr"])
        & (df["status"] == "ok")
    ]
    return {int(s): float(v) for s, v in zip(sel["seed"], sel["val_loss"]) if math.isfinite(v)}


def compare_widths(df: pd.DataFrame, tolerance: float = 0.01) -> dict:
    """The across-width check of a DP sweep table with a `width` column (≥ 2 widths): per ε, each
    width's best cell, and whether the narrowest width's holds at the widest (module docstring)."""
    widths = sorted(int(w) for w in df["width"].unique())
    if len(widths) < 2:
        raise ValueError(f"the across-width check needs DP sweeps at ≥ 2 widths, got {widths}")
    narrow, wide = widths[0], widths[-1]
    best = best_cells(df)
    out = []
    for eps in sorted(df["epsilon"].unique()):
        per = {int(r["width"]): r for _, r in best[best["epsilon"] == eps].iterrows()}
        entry: dict = {
            "epsilon": float(eps),
            "best": {str(w): {**_cell(r), "val_loss": float(r["mean"]), "seeds": int(r["n"])} for w, r in sorted(per.items())},
        }
        if narrow not in per or wide not in per:
            entry.update(verdict="inconclusive", why=f"no ok trial at width {narrow if narrow not in per else wide}")
            out.append(entry)
            continue
        chosen, own = _cell(per[narrow]), _cell(per[wide])
        same = {k: chosen[k] == own[k] for k in CELL}
        a, b = _losses(df, wide, eps, chosen), _losses(df, wide, eps, own)
        seeds = sorted(set(a) & set(b))
        tol = tolerance * float(per[wide]["mean"])
        entry.update(same=same, tolerance=tol)
        if all(same.values()):
            entry.update(difference={"mean": 0.0, "lo": 0.0, "hi": 0.0, "seeds": len(seeds)}, verdict="holds")
            entry["why"] = f"width {narrow} chose the cell width {wide} finds best"
        elif not seeds:
            entry.update(verdict="inconclusive", why=f"width {narrow}'s cell has no ok trial at width {wide}")
        else:
            mean, lo, hi = _t_interval([a[s] - b[s] for s in seeds])
            entry["difference"] = {"mean": mean, "lo": lo, "hi": hi, "seeds": len(seeds)}
            if hi is not None and hi <= tol:
                entry["verdict"], entry["why"] = "holds", f"its extra loss at width {wide} is below {tol:.3g} (95%)"
            elif lo is not None and lo > tol:
                entry["verdict"], entry["why"] = "does not hold", f"its extra loss at width {wide} exceeds {tol:.3g} (95%)"
            else:
                entry["verdict"] = "inconclusive"
                entry["why"] = "one seed: no interval" if lo is None else f"the interval straddles {tol:.3g}"
        out.append(entry)
    return {"narrow_width": narrow, "wide_width": wide, "widths": widths, "tolerance": tolerance, "per_epsilon": out}


def summary(check: dict) -> str:
    """One line per ε, for the console and the plan's notes."""
    lines = []
    for e in check["per_epsilon"]:
        d = e.get("difference")
        iv = "" if not d or d.get("lo") is None else f" {d['mean']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]"
        lines.append(
            f"ε={e['epsilon']:g}: width {check['narrow_width']}'s (B, C, lr) at width {check['wide_width']}: "
            f"{e['verdict']}{iv} ({e['why']})"
        )
    return "\n".join(lines)
