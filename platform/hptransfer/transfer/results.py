"""A sweep's results table: read it (torn or partial writes refused), check every column at once,
check that it belongs to the study's sweep (its hash, what the rule trains with), the per-width
optima the rules start from, and a spec for a table made by another tool (`standalone_spec`).
Pure functions of the table, except `read_results` and `file_hash`, which read a file."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pandas as pd

from hptransfer.errors import ResultsError
from hptransfer.hyperparameters import LOG_SCALE, TUNABLE
from hptransfer.spec import (
    MAX_SEED,
    MAX_WIDTH,
    PACKAGE_DEFAULTS_HINT,
    RULE_TRAINING,
    StudySpec,
    package_defaults_sweep_hash,
    parse_spec,
    rule_training,
)
from hptransfer.spec import sweep_hash as sweep_hash_of
from hptransfer.transfer.axes import (
    AXES,
    at_base,
    axis_columns,
    base_point,
)
from hptransfer.transfer.joint import is_grid
from hptransfer.transfer.joint_pooled import joint_optima
from hptransfer.transfer.optimum import OptimumFit, fit_optimum

STATUSES = {"ok", "diverged", "failed", "stopped"}


def check_results(
    results: pd.DataFrame, tuned: list[str], source: str = "results", target_width: int | None = None
) -> pd.DataFrame:
    """Validate a results table against the contract and return a normalised copy.

    Contract: one row per trial; `width` (int), one column per tuned hyperparameter, `seed`,
    `val_loss` (NaN when not ok), `status` in {ok, diverged, failed, stopped}; extra columns are
    ignored. A missing `seed` column means one seed (0). An `ok` row with a non-finite loss
    diverged (NaN/inf loss is what divergence looks like).

    One width is enough when it is `target_width` itself (issue 37: Bjorck et al.'s setting, the
    target's size tuned on shorter horizons or smaller batches): width is then not transferred, and
    the table's steps/batch/depth arms carry the plan to the target; a width trend is needed only to
    go wider."""
    problems = []
    df = results.reset_index(drop=True)  # a concatenated table may repeat index labels
    if "seed" not in df.columns:
        df["seed"] = 0
    missing = [c for c in ("width", "val_loss", "status", *tuned) if c not in df.columns]
    if missing:
        have = ", ".join(map(str, df.columns))
        problems.append(
            f"missing column(s) {missing}; the table has [{have}]. Rename your columns: "
            "`width`, `val_loss`, `status` and one per tuned hyperparameter "
            f"(one of {sorted(TUNABLE)})"
        )
        raise ResultsError(source, problems)
    if df.empty:
        raise ResultsError(source, ["the table has no rows; run the sweep first"])
    width = pd.to_numeric(df["width"], errors="coerce")
    bad = df.loc[~np.isfinite(width) | (width <= 0) | (width != width.round()) | (width > MAX_WIDTH), "width"]
    if len(bad):
        problems.append(f"column `width` must hold positive integers up to {MAX_WIDTH:,}, got {bad.unique()[:5].tolist()}")
    seed = pd.to_numeric(df["seed"], errors="coerce")
    bad = df.loc[~np.isfinite(seed) | (seed != seed.round()) | (seed < 0) | (seed > MAX_SEED), "seed"]
    if len(bad):
        problems.append(
            f"column `seed` must hold integers 0..{MAX_SEED} (one per trial; drop the column for one "
            f"seed), got {bad.unique()[:5].tolist()}"
        )
    # an empty cell stays NaN through astype(str) on pandas ≥ 3: name it, so it is reported, not sorted against strings
    df["status"] = df["status"].fillna("<empty>").astype(str).str.strip().str.lower()
    unknown = sorted(set(df["status"]) - STATUSES)
    if unknown:
        problems.append(f"column `status` has unknown value(s) {unknown}; allowed: {sorted(STATUSES)}")
    loss = pd.to_numeric(df["val_loss"], errors="coerce")
    if loss.isna().sum() > df["val_loss"].isna().sum():
        problems.append(
            "column `val_loss` has non-numeric entries; use a number, or leave it empty (NaN) when the trial was not ok"
        )
    for hp in tuned:
        v = pd.to_numeric(df[hp], errors="coerce")
        if v.isna().any():
            problems.append(
                f"column `{hp}` has empty or non-numeric entries in {int(v.isna().sum())} row(s); "
                "every trial needs its hyperparameter value"
            )
        elif hp in LOG_SCALE and (v <= 0).any():
            problems.append(f"column `{hp}` must be > 0 (fitted on a log scale), got {sorted(v[v <= 0].unique())[:5]}")
    for axis in AXES:  # optional columns of arms beyond the width ladder (transfer/axes.py)
        if axis in df.columns:
            v = pd.to_numeric(df[axis], errors="coerce")
            bad = df.loc[v.notna() & (~np.isfinite(v) | (v <= 0) | (v != v.round())), axis]
            if len(bad) or (v.isna() & df[axis].notna()).any():
                problems.append(
                    f"column `{axis}` must hold positive integers (empty: the ladder's own {axis}), got "
                    f"{df.loc[(v.isna() & df[axis].notna()) | v.index.isin(bad.index), axis].unique()[:5].tolist()}"
                )
    for hp in tuned:
        v = pd.to_numeric(df[hp], errors="coerce")
        if hp in df.columns and (~np.isfinite(v.dropna())).any():
            problems.append(f"column `{hp}` has non-finite values (inf); every trial needs a finite value")
    if problems:
        raise ResultsError(source, problems)
    df["width"] = width.astype(int)
    df["seed"] = seed.astype(int)
    df["val_loss"] = loss.astype(float)
    for hp in tuned:
        df[hp] = pd.to_numeric(df[hp]).astype(float)
    df.loc[(df["status"] == "ok") & ~np.isfinite(df["val_loss"]), "status"] = "diverged"
    good = df[(df["status"] == "ok") & np.isfinite(df["val_loss"])]
    if good.empty:
        problems.append(
            f"no trial has status ok and a finite val_loss (statuses: "
            f"{df['status'].value_counts().to_dict()}); fix the sweep (lower the LR grid) and rerun"
        )
    elif good["width"].nunique() < 2 and good["width"].iloc[0] != target_width:
        problems.append(
            f"only one width ({good['width'].unique().tolist()}) has a finite loss; transfer needs "
            "a trend: sweep at least 2 widths (3+ to judge drift)"
            + (
                f", or set the target's width to {int(good['width'].iloc[0])} to transfer along steps, batch or depth only"
                if target_width is not None
                else ""
            )
        )
    if problems:
        raise ResultsError(source, problems)
    return df


def check_results_belong(results: pd.DataFrame, spec: StudySpec, sweep_hash: str | None, source: str) -> None:
    """A study's table must come from its spec: same sweep (the `spec_hash` column the sweep writes:
    spec.sweep_hash, which includes what the rule changes in training) and only widths and grid
    values the spec has. Raises ResultsError listing every mismatch.

    The rows carry nothing else that says how they were trained, so the hash is what binds them to
    µP's weight-decay scaling: a table whose hash is this spec's under the other scaling was trained
    the other way, and a plan from it is refused with the fix."""
    problems = []
    if "spec_hash" in results.columns and sweep_hash is not None:
        found = sorted({str(h) for h in results["spec_hash"].dropna().unique()} - {sweep_hash})
        trained = _trained_otherwise(spec, found) or _swept_at_package_defaults(spec, found)
        if trained:
            problems.append(trained)
        elif found:
            problems.append(
                f"the table comes from another sweep (spec_hash {found}, this spec's is {sweep_hash}); rerun "
                "`hpt sweep` with this spec (add --restart to replace the old results) or restore the old spec"
            )
    # (a missing or non-numeric `width` column is check_results' to report, with the other problems)
    widths = pd.to_numeric(results["width"], errors="coerce") if "width" in results.columns else pd.Series(dtype=float)
    extra = sorted({int(w) for w in widths[np.isfinite(widths)].unique()} - set(spec.sweep.widths))
    if extra:
        problems.append(f"widths {extra} are not in sweep.widths {spec.sweep.widths}; the table belongs to another spec")
    for hp, values in spec.sweep.grid.items():
        if hp not in results.columns:
            continue
        col = pd.to_numeric(results[hp], errors="coerce").dropna()
        if spec.sweep.search == "optuna":  # a box [low, high], not grid values
            lo, hi = values[0] * (1 - 1e-9), values[1] * (1 + 1e-9)
            off = sorted({float(v) for v in col.unique() if not lo <= v <= hi})
            if off:
                problems.append(f"column `{hp}` has values {off[:5]} outside the box sweep.grid.{hp} {values}")
            continue
        allowed = list(values)
        if hp == "lr" and spec.sweep.axes is not None and len(values) >= 2:
            # sweep.axes.bracket: an arm's lr continued a grid step at a time beyond either end (sweep/ladder.py)
            g = sorted(values)
            k = range(1, spec.sweep.axes.bracket + 1)
            allowed += [g[0] * (g[0] / g[1]) ** i for i in k] + [g[-1] * (g[-1] / g[-2]) ** i for i in k]
        off = sorted({float(v) for v in col.unique() if not any(np.isclose(v, a, rtol=1e-9, atol=0) for a in allowed)})
        if off:
            problems.append(f"column `{hp}` has values {off[:5]} that are not in sweep.grid.{hp} {values}")
    if problems:
        raise ResultsError(source, problems)


def _trained_otherwise(spec: StudySpec, hashes: list[str]) -> str | None:
    """The problem to report when `hashes` are this spec's sweep under another weight-decay scaling."""
    mine = rule_training(spec.transfer.rule).under(spec.model.parametrization)
    for other in {t for t in RULE_TRAINING.values() if t != mine}:
        h = sweep_hash_of(spec, other)
        if h not in hashes:
            continue
        s, theirs = mine.weight_decay_scaling, other.weight_decay_scaling
        rules = [r for r, t in RULE_TRAINING.items() if t == other and (r != "dp" or spec.dp is not None)]
        legacy = "; so does a `mup-standard-wd` sweep made before the scaling entered the hash" if theirs == "independent" else ""
        return (
            f"the table's trials were trained with µP's {theirs} weight-decay scaling (spec_hash {h}{legacy}), "
            f"but transfer.rule `{spec.transfer.rule}` trains with {s} scaling: a plan would assume trials the "
            f"sweep did not run. Re-sweep with this rule (`hpt sweep SPEC --study-dir DIR --restart`), or choose "
            f"a rule with {theirs} scaling ({', '.join(rules)})"
        )
    return None


def _swept_at_package_defaults(spec: StudySpec, hashes: list[str]) -> str | None:
    """The problem to report when `hashes` are this spec's sweep as an earlier version ran it, before
    the family defaults filled sweep.fixed (issue 36 item 1)."""
    h = package_defaults_sweep_hash(spec)
    if h is None or h not in hashes:
        return None
    return (
        f"the table's trials (spec_hash {h}) do not match this spec's: {PACKAGE_DEFAULTS_HINT}, or re-sweep "
        "(`hpt sweep SPEC --study-dir DIR --restart`) at the new defaults; a plan would assume trials the sweep did not run"
    )


def optima_by_width(results: pd.DataFrame, tuned: list[str], pool_widths: bool = False) -> dict[int, dict[str, OptimumFit]]:
    """For each width and tuned hyperparameter, the optimum with the others at their best grid point.

    With one tuned hyperparameter this is the plain 1-D fit; with several, each is fitted along its
    own axis through the best grid point (a coordinate-wise estimate, stated as such). A table whose
    points are not a grid (`joint.is_grid`) gets the joint optimum instead (`joint.joint_optimum`). `stopped`
    (early-stopped) and `failed` trials are left out of the fit; `diverged` ones inform it (too high).
    Widths without one finite ok loss are skipped. `pool_widths` (µP: the widths share an optimum):
    scattered points are fitted over all widths at once (transfer/joint_pooled.py)."""
    out: dict[int, dict[str, OptimumFit]] = {}
    results = results.reset_index(drop=True)
    if not is_grid(results, tuned):  # points from a searcher: the joint local quadratic (transfer/joint.py)
        return joint_optima(results, tuned, pool=pool_widths)
    status = results["status"].astype(str).str.lower()
    diverged_all = (status == "diverged") | ((status == "ok") & ~np.isfinite(results["val_loss"].astype(float)))
    for width, g in results.groupby("width"):
        ok = (status.loc[g.index] == "ok") & np.isfinite(g["val_loss"].astype(float))
        if not ok.any():
            continue
        loss = g["val_loss"].where(ok)
        # The slices go through the seed-averaged best grid point, not the luckiest single trial.
        best_row = g[ok].groupby(tuned)["val_loss"].mean().idxmin()
        best_row = dict(zip(tuned, best_row if isinstance(best_row, tuple) else (best_row,)))
        keep = ok | diverged_all.loc[g.index]
        fits = {}
        for hp in tuned:
            sel = g[keep]
            for other in tuned:
                if other != hp:
                    sel = sel[np.isclose(sel[other], best_row[other])]
            fits[hp] = fit_optimum(
                sel[hp].to_numpy(float),
                loss.loc[sel.index].to_numpy(float),
                hp in LOG_SCALE,
                diverged=diverged_all.loc[sel.index].to_numpy(),
            )
        out[int(width)] = fits
    return out


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def table_hash(results: pd.DataFrame) -> str:
    return hashlib.sha256(pd.util.hash_pandas_object(results, index=False).values.tobytes()).hexdigest()[:16]


# --- standalone use: a results table from any tool, no spec -------------------------------------


def tuned_columns(results: pd.DataFrame) -> tuple[list[str], dict[str, float]]:
    """Tunable hyperparameter columns that vary (tuned) and those with one value (fixed)."""
    tuned, fixed = [], {}
    for c in results.columns:
        if c in TUNABLE:
            vals = pd.to_numeric(results[c], errors="coerce").dropna().unique()
            if len(vals) > 1:
                tuned.append(c)
            elif len(vals) == 1:
                fixed[c] = float(vals[0])
    return tuned, fixed


def standalone_spec(
    results: pd.DataFrame,
    *,
    rule: str,
    target_width: int,
    base_width: int | None = None,
    proxy_steps: int = 100,
    proxy_batch_size: int = 16,
    target_steps: int | None = None,
    target_batch_size: int | None = None,
    target_depth: int | None = None,
    model: dict | None = None,
    transfer: dict | None = None,
    name: str = "standalone",
    source: str = "results",
) -> StudySpec:
    """A StudySpec describing a sweep made elsewhere, so `make_plan` serves both modes. A table with
    `steps`, `batch_size` or `depth` columns sets the ladder's own values (the base point: the value
    most widths ran at; transfer/axes.py) instead of proxy_steps / proxy_batch_size / model depth."""
    tuned, fixed = tuned_columns(results)
    if not tuned:
        raise ResultsError(
            source,
            [
                f"no hyperparameter column varies; name the tuned column(s) one of "
                f"{sorted(TUNABLE)} (e.g. rename `learning_rate` to `lr`)"
            ],
        )
    df = check_results(results, tuned, source, target_width=target_width)
    model = dict(model or {})
    defaults = {"steps": proxy_steps, "batch_size": proxy_batch_size, "depth": int(model.get("depth", 2))}
    base = base_point(df, defaults)
    proxy_steps, proxy_batch_size = base["steps"], base["batch_size"]
    if "depth" in df.columns:
        model["depth"] = base["depth"]
    df = df[at_base(axis_columns(df, base), base)]  # the width ladder
    widths = sorted(int(w) for w in df["width"].unique())
    grid = {hp: sorted(float(v) for v in df[hp].unique()) for hp in tuned}
    seeds = sorted(int(s) for s in df["seed"].unique())
    # Scattered points make a "grid" of every value seen: its product is no trial count to refuse.
    max_trials = max(2000, len(widths) * (len(seeds) * math.prod(len(v) for v in grid.values()) + 3))
    data = {
        "name": name,
        "model": {**model, **({"base_width": base_width} if base_width else {})},
        "sweep": {
            "widths": widths,
            "grid": grid,
            "fixed": fixed,
            "steps": proxy_steps,
            "batch_size": proxy_batch_size,
            "seeds": seeds,
            "max_trials": max_trials,
        },
        "transfer": {"rule": rule, **(transfer or {})},
        "target": {"width": target_width, "steps": target_steps, "batch_size": target_batch_size, "depth": target_depth},
    }
    return parse_spec(data, source=f"{source} (as a study)")


ID_COLUMNS = ("spec_hash", "trial_id")  # text columns of a results table, whatever they look like


def read_results(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise ResultsError(str(path), [f"file not found: {path}"])
    from hptransfer.errors import Problem
    from hptransfer.io import sidecar, torn

    if why := torn(path):
        raise ResultsError(
            str(path),
            [
                Problem(
                    "",
                    f"cut short while it was written ({why}): a crash on a filesystem without atomic rename, or a full disk",
                    fix="rewrite it from the sweep's own state, no trial trained again: rerun the same `hpt sweep SPEC "
                    f"--study-dir DIR` (or `hpt run`); if you shortened it by hand on purpose, delete {sidecar(path).name}",
                )
            ],
        )
    if path.suffix.lower() == ".parquet":
        return pd.read_parquet(path)
    if path.suffix.lower() in (".csv", ".txt"):
        # Identifiers stay text: a hex hash such as 72526379e0394572 would otherwise parse as a float (inf).
        return pd.read_csv(path, dtype=dict.fromkeys(ID_COLUMNS, str))
    raise ResultsError(str(path), [f"unknown table format {path.suffix!r}; use .csv or .parquet"])
