"""The results-table contract: statuses, extra columns, several tuned hyperparameters."""

import math

import numpy as np
import pandas as pd
import pytest

from hptransfer.transfer.engine import (
    ResultsError,
    check_results,
    check_results_belong,
    make_plan,
    optima_by_width,
    read_results,
    standalone_spec,
)
from hptransfer.transfer.synthetic import synthetic_sweep

GRID = list(np.geomspace(1e-4, 1e-1, 13))


def test_stopped_and_failed_trials_do_not_move_the_optimum():
    df = synthetic_sweep([32, 64, 128], GRID, nu_inf=3e-3)
    base = optima_by_width(check_results(df, ["lr"]), ["lr"])
    # ASHA stopped some trials early (higher loss from fewer steps) and one crashed: not evidence.
    extra = df.sample(10, random_state=0).assign(status="stopped", val_loss=9.0, steps_done=5)
    crash = df.iloc[:1].assign(status="failed", val_loss=np.nan)
    got = optima_by_width(check_results(pd.concat([df, extra, crash]), ["lr"]), ["lr"])
    for w in base:
        assert got[w]["lr"].value == pytest.approx(base[w]["lr"].value)
        assert got[w]["lr"].n_diverged == 0


def test_ok_with_non_finite_loss_counts_as_diverged():
    df = synthetic_sweep([32, 64], GRID, nu_inf=3e-3)
    df.loc[df["lr"] > 2e-2, "val_loss"] = np.inf  # status still "ok"
    checked = check_results(df, ["lr"])
    assert (checked.loc[checked["lr"] > 2e-2, "status"] == "diverged").all()
    assert optima_by_width(checked, ["lr"])[32]["lr"].n_diverged == ((df["width"] == 32) & (df["lr"] > 2e-2)).sum() == 3


def test_two_tuned_hyperparameters_are_each_recovered():
    rows = []
    for w in (32, 64, 128):
        for lr in GRID[3:10]:
            for wd in (0.01, 0.03, 0.1, 0.3, 1.0):
                loss = 2 + 0.08 * math.log(lr / 3e-3) ** 2 + 0.05 * math.log(wd / 0.1) ** 2 + w**-0.5
                rows.append({"width": w, "lr": lr, "weight_decay": wd, "seed": 0, "val_loss": loss, "status": "ok"})
    df = pd.DataFrame(rows)
    plan = make_plan(standalone_spec(df, rule="mup", target_width=512, model={"family": "mlp"}), df)
    assert plan.hyperparameters["lr"] == pytest.approx(3e-3, rel=1e-6)
    assert plan.hyperparameters["weight_decay"] == pytest.approx(0.1, rel=1e-6)
    assert plan.diagnostics.tuned == ["lr", "weight_decay"]


def test_all_problems_of_a_table_are_reported_at_once():
    df = synthetic_sweep([32, 64], GRID).assign(status="maybe")
    df.loc[0, "lr"] = -1.0
    with pytest.raises(ResultsError) as e:
        check_results(df, ["lr"])
    assert len(e.value.problems) == 2
    assert "status" in e.value.problems[0] and "`lr` must be > 0" in e.value.problems[1]


def test_a_hash_that_looks_like_a_number_is_read_back_as_text(tmp_path):
    """A sweep hash of hex digits with one `e` (72526379e0394572) parses as a float (inf) unless the
    reader keeps identifiers as text; the study then refused its own results (seen in CI)."""
    df = synthetic_sweep([32, 64], list(np.geomspace(1e-3, 1e-1, 5)), noise=0.0)
    df["spec_hash"], df["trial_id"] = "72526379e0394572", "1e5"
    path = tmp_path / "sweep_results.csv"
    df.to_csv(path, index=False)
    back = read_results(path)
    assert set(back["spec_hash"]) == {"72526379e0394572"} and set(back["trial_id"]) == {"1e5"}
    spec = standalone_spec(back, rule="mup", target_width=256, model={"family": "mlp"})
    check_results_belong(back, spec, "72526379e0394572", str(path))  # its own sweep: accepted
