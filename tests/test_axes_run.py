"""`hpt run` with sweep.axes end to end (issue 23): the ladder's arms at other horizons and batches
(and a depth, issue 24) run in the same Tune sweep, the table carries steps/batch_size/depth/noise_scale, the plan composes
the axis laws, and the report draws them. One small run: MLP widths 16, 32, 3 LRs, 12 steps."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from hptransfer.plan import load_plan

from conftest import tiny_spec_dict


@pytest.mark.slow
def test_hpt_run_with_axes_end_to_end(tmp_path):
    d = tiny_spec_dict(
        name="axes",
        sweep={"axes": {"width": 16, "steps": [6, 24], "batch_size": [4], "depth": [3], "noise_scale_batches": 2}},
        target={"width": 64, "steps": 24, "batch_size": 16, "depth": 4},
        train={"workers": 1, "eval_every": 12},
    )
    spec = tmp_path / "axes.yaml"
    spec.write_text(yaml.safe_dump(d))
    study = tmp_path / "study"
    r = subprocess.run(
        # --until transfer: this test is about the sweep's arms, the laws and the plan; the large run
        # of a plan is tested elsewhere (test_pipeline, test_train), and cost ~40 s here
        [
            sys.executable,
            "-m",
            "hptransfer",
            "run",
            str(spec),
            "--study-dir",
            str(study),
            "--skip-coord-check",
            "--until",
            "transfer",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    df = pd.read_csv(study / "sweep_results.csv")
    # 2 widths + 4 arms at width 16 (two horizons, a batch, a depth), 3 LRs each; an arm whose best LR
    # was an edge of what it tried also ran an LR a grid step (×10) beyond it (sweep.axes.bracket, ≤ 2).
    grid = d["sweep"]["grid"]["lr"]
    on_grid = df.lr.apply(lambda v: any(abs(v / g - 1) < 1e-9 for g in grid))
    ladder = (df.steps == 12) & (df.batch_size == 8) & (df.depth == 2)
    assert on_grid[ladder].all() and len(df[ladder]) == 2 * 3  # the width ladder is not bracketed
    arms = df[df.width == 16].groupby(["steps", "batch_size", "depth"])
    assert set(arms.groups) == {(6, 8, 2), (12, 4, 2), (12, 8, 2), (24, 8, 2), (12, 8, 3)}
    for key, g in arms:
        if key == (12, 8, 2):
            continue
        tried = sorted(g.lr)
        assert len(set(tried)) == len(tried) and 3 <= len(tried) <= 5 and on_grid[g.index].sum() == 3, (key, tried)
        steps = [b / a for a, b in itertools.pairwise(tried)]
        assert all(abs(r / 10 - 1) < 1e-9 for r in steps), (key, tried)  # the grid continued, step for step
        if len(tried) == 3:  # not extended: its best LR was inside the grid, or the LR above it diverged
            ok = g[g.status == "ok"]
            best = ok.groupby("lr").val_loss.mean().idxmin()
            assert tried[0] < best < tried[-1] or (g[g.lr > best].status == "diverged").any(), (key, g)
    assert len(df) == 6 + sum(len(g) for k, g in arms if k != (12, 8, 2))
    assert df.loc[df.status == "ok", "steps_done"].equals(df.loc[df.status == "ok", "steps"])
    assert df.loc[df.status == "ok", "noise_scale"].notna().any()
    plan = load_plan(study / "transfer_plan.yaml")
    laws = plan.axes["laws"]
    # Each law's verdict follows from how many of its arms have a point optimum, counted here from the
    # table: an arm's best LR strictly inside its grid (on the grid's edge, or just below a diverged LR,
    # it is only a bound).
    arm = {"steps": {"batch_size": 8, "depth": 2}, "batch_size": {"steps": 12, "depth": 2}}
    for axis, fixed in arm.items():
        rows = df[(df.width == 16) & (df[list(fixed)] == pd.Series(fixed)).all(axis=1)]
        interior = {}
        for v, g in rows.groupby(axis):
            tried, ok = sorted(g.lr), g[g.status == "ok"]
            if len(ok):
                best = ok.groupby("lr").val_loss.mean().idxmin()
                above = [lr for lr in tried if lr > best]
                capped = bool(above) and (g[g.lr == above[0]].status == "diverged").any()  # a bound below a divergence
                interior[int(v)] = tried[0] < best < tried[-1] and not capped
        law = laws[axis]
        assert law["values"] == sorted(interior), (axis, law["values"], interior)
        n = sum(interior.values())
        want = "cannot tell" if n < 2 else ("undecided" if len(interior) == 2 else "fitted")
        assert law["verdict"] == want, (axis, law["verdict"], interior)
        # A fit whose interval is wider than the prior's range gives way to the prior (issue 37 item 4).
        wide = law.get("exponent_ci") is not None and law["prior_range"][1] > law["prior_range"][0]
        wide = wide and law["exponent_ci"][1] - law["exponent_ci"][0] > law["prior_range"][1] - law["prior_range"][0]
        assert law["basis"] == ("prior" if want == "cannot tell" or wide else "fit"), (axis, law)
        assert law.get("wider_than_prior", False) == (want != "cannot tell" and wide), (axis, law)
        if want != "cannot tell":
            assert law["n_bounds"] == len(interior) - n
    assert laws["steps"]["values"] == [6, 12, 24] and laws["batch_size"]["values"] == [4, 8]
    assert plan.target.steps == 24 and plan.target.batch_size == 16
    # The depth arm (issue 24): a law from two depths, and a target deeper than both under standard residuals is warned.
    assert laws["depth"]["values"] == [2, 3] and laws["depth"]["verdict"] == "undecided"
    assert (plan.model.depth, plan.model.base_depth) == (4, 2)
    assert any("deeper than every depth the ladder ran (max 3)" in w for w in plan.diagnostics.warnings)
    assert "stopped after the plan (--until transfer)" in r.stdout and not (study / "train" / "train_metrics.json").exists()
    report = (study / "report" / "index.html").read_text()
    assert "Optimum against steps, batch size and depth" in report and (study / "report" / "axes.png").is_file()
