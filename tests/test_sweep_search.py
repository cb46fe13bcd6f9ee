"""`sweep.search: optuna` (issue 25, item 1): the spec's box and budget, validated; the searcher that
hands out each width's Optuna (TPE) points through Ray Tune's OptunaSearch, then its replicates,
with a concurrency limit, diverged trials told as the worst loss, and its state surviving a resume.
Driven here by a plain loop standing in for Tune's (fast: no Ray runtime)."""

import copy
import math

import numpy as np
import pytest

from hptransfer.hyperparameters import LOG_SCALE
from hptransfer.spec import SpecError, parse_spec, sweep_hash
from hptransfer.sweep.search import OptunaLadderSearcher, optuna_space

LR, OM = 3e-3, 1.4
BOX = {"lr": [1e-4, 1e-1], "output_mult": [0.25, 8.0]}


def loss(point):
    u, v = math.log(point["lr"] / LR), math.log(point["output_mult"] / OM)
    return 2 + 4 * point["width"] ** -0.5 + 0.1 * u * u + 0.36 * u * v + 0.4 * v * v


def result(point):
    if point["lr"] > 5e-2:  # the edge of stability
        return {"status": "diverged", "val_loss": math.nan}
    return {"status": "ok", "val_loss": loss(point)}


def searcher(budget=16, max_concurrent=2):
    return OptunaLadderSearcher(
        [{"width": 64}, {"width": 32}],
        BOX,
        LOG_SCALE,
        budget,
        0,
        [1, 2],
        {64: 0, 32: 1},
        max_concurrent=max_concurrent,
        ok=lambda r: r.get("status") == "ok",
        status=lambda r: r.get("status", "ok"),
    )


def drive(s, stop_after=None, start=0, live=None):
    """Tune's loop: ask for a trial whenever one may start, finish the oldest when none may.
    Returns (points handed out in order, the most running at once, trials still running)."""
    handed, live, peak, n = [], dict(live or {}), 0, start
    while True:
        if stop_after is not None and len(handed) >= stop_after:
            return handed, peak, live
        tid = f"t{n}"
        p = s.suggest(tid)
        if p == "FINISHED":
            return handed, peak, live
        if p is None:
            assert live, "the searcher waits with nothing running"
            done = next(iter(live))
            s.on_trial_complete(done, result(live.pop(done)))
            continue
        n += 1
        live[tid] = p
        handed.append(p)
        peak = max(peak, len(live))


def test_each_width_gets_its_budget_then_its_replicates_within_the_concurrency_limit():
    handed, peak, _ = drive(searcher(budget=16, max_concurrent=2))
    assert peak == 2
    for w in (32, 64):
        searched = [p for p in handed if p["width"] == w and not p["replicate"]]
        reps = [p for p in handed if p["width"] == w and p["replicate"]]
        assert len(searched) == 16 and all(p["seed"] == 0 for p in searched)
        assert all(BOX[hp][0] <= p[hp] <= BOX[hp][1] for p in searched for hp in BOX)
        ok = [p for p in searched if p["lr"] <= 5e-2]
        best = min(ok, key=loss)
        assert [r["seed"] for r in reps] == [1, 2] and all(r["lr"] == best["lr"] for r in reps)
        assert len({p["lr"] for p in searched}) == 16  # not a grid: every point its own
    # The widest width's work starts first, and every replicate comes after its own width's budget.
    assert handed[0]["width"] == 64
    for w in (32, 64):
        last = max(i for i, p in enumerate(handed) if p["width"] == w and not p["replicate"])
        assert min(i for i, p in enumerate(handed) if p["width"] == w and p["replicate"]) > last


def test_tpe_concentrates_near_the_optimum_on_the_log_scale():
    """After the random start-up trials, TPE's points sit closer to the optimum than random ones
    (distance in log units): the sampler is told the losses, on the declared scale."""
    s = searcher(budget=40, max_concurrent=1)
    handed, _, _ = drive(s)
    pts = [p for p in handed if p["width"] == 64 and not p["replicate"]]
    dist = [math.hypot(math.log(p["lr"] / LR), math.log(p["output_mult"] / OM)) for p in pts]
    early, late = np.mean(dist[:8]), np.mean(dist[-12:])
    assert late < 0.6 * early, (early, late)
    dists = optuna_space(BOX, LOG_SCALE)
    assert dists["lr"].log and dists["output_mult"].log  # both log-scale tunables
    assert not optuna_space({"warmup_steps": [0, 100]}, LOG_SCALE)["warmup_steps"].log


def test_a_diverged_trial_is_told_as_the_worst_loss_and_a_failed_one_as_a_failure():
    s = searcher(budget=6, max_concurrent=1)
    for tid, r in [
        ("a", {"status": "ok", "val_loss": 3.0}),  # width 64
        ("b", {"status": "ok", "val_loss": 2.5}),  # width 32 (the arms take turns)
        ("c", {"status": "diverged", "val_loss": math.nan}),  # width 64: "too high", the worst seen there
        ("d", None),  # width 32: a crash, no information
    ]:
        s.suggest(tid)
        s.on_trial_complete(tid, r, error=r is None)
    wide, narrow = (st._ot_study.trials for st in s.studies)
    assert [(t.state.name, t.value) for t in wide] == [("COMPLETE", 3.0), ("COMPLETE", 3.0)]
    assert [(t.state.name, t.value) for t in narrow] == [("COMPLETE", 2.5), ("FAIL", None)]


def test_the_state_survives_a_resume_and_continues_as_if_uninterrupted(tmp_path):
    """Tune saves the searcher with its experiment state (save/restore); a restored searcher, its
    Optuna studies included, hands out exactly what the uninterrupted one would have."""
    whole, _, _ = drive(searcher())
    first = searcher()
    part, _, live = drive(first, stop_after=13)
    first.save(str(tmp_path / "searcher.pkl"))
    again = searcher()
    again.restore(str(tmp_path / "searcher.pkl"))
    rest, _, _ = drive(again, start=13, live=live)
    assert part + rest == whole


def _spec(**sweep):
    base = {
        "name": "t",
        "model": {"family": "mlp"},
        "sweep": {"widths": [32, 64], "grid": dict(BOX), "noise_seeds": 2},
        "target": {"width": 256},
    }
    base["sweep"].update(sweep)
    return parse_spec(copy.deepcopy(base))


def test_the_spec_reads_the_grid_as_a_box_and_validates_it():
    s = _spec(search="optuna", optuna={"trials_per_width": 12, "max_concurrent": 3})
    assert s.sweep.n_trials == 2 * (12 + 2) and s.sweep.optuna_settings.max_concurrent == 3
    assert _spec(search="optuna").sweep.optuna_settings.trials_per_width == 20  # defaults when omitted
    assert sweep_hash(_spec(search="optuna")) != sweep_hash(_spec())  # another sweep: not resumed as the grid
    for sweep, says in [
        ({"search": "optuna", "grid": {"lr": [1e-3, 1e-2, 1e-1]}}, "each sweep.grid entry is the box [low, high]"),
        ({"search": "optuna", "grid": {"lr": [1e-1, 1e-3]}}, "(low < high)"),
        ({"search": "optuna", "seeds": [0, 1]}, "runs one seed per point"),
        ({"optuna": {"trials_per_width": 5}}, "set `search: optuna` or remove sweep.optuna"),
        ({"search": "optuna", "optuna": {"trials_per_width": 1}}, "sweep.optuna.trials_per_width"),
        ({"search": "optuna", "optuna": {"max_concurent": 2}}, "max_concurent"),
        ({"search": "bayes"}, "sweep.search"),
    ]:
        with pytest.raises(SpecError, match=None) as e:
            _spec(**sweep)
        assert says in str(e.value), (sweep, str(e.value))
