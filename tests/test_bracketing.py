"""Arms designed to be fitted (issue 37 item 4): a sweep.axes arm whose best lr is an edge of what it
tried runs one lr a grid step beyond, with the grid's seeds, up to sweep.axes.bracket times, before
its replicates (sweep/ladder.py: LadderSearcher); the arms run mid-ladder by default; the results
check accepts exactly those values; old studies keep their hashes where their trials are the same."""

import math

import pandas as pd
import pytest

from hptransfer.errors import ResultsError
from hptransfer.spec import parse_spec
from hptransfer.spec.study import mid_width, sweep_hash
from hptransfer.sweep.ladder import LadderSearcher
from hptransfer.transfer.results import check_results_belong

from conftest import tiny_spec_dict

GRID = [0.01, 0.03, 0.1]
ARM = {"width": 32, "steps": 24, "batch_size": 8}


def _points(seeds=(0, 1)):
    ladder = [{"width": 16, "steps": 12, "batch_size": 8, "seed": s, "lr": lr} for s in seeds for lr in GRID]
    arm = [{**ARM, "seed": s, "lr": lr} for s in seeds for lr in GRID]
    return ladder + arm


def _drive(searcher, loss, diverge_above=math.inf, limit=200):
    """Run the searcher to FINISHED as Tune would, one trial at a time; returns the points in order."""
    ran = []
    for i in range(limit):
        p = searcher.suggest(f"t{i}")
        if p == LadderSearcher.FINISHED:
            return ran
        assert p is not None, "nothing live and nothing handed out"
        ran.append(p)
        ok = p["lr"] <= diverge_above
        result = {"val_loss": loss(p["lr"]) if ok else math.nan, "status": "ok" if ok else "diverged"}
        searcher.on_trial_complete(f"t{i}", result)
    raise AssertionError("the searcher did not finish")


def _searcher(bracket=2, replicates=(7, 8)):
    return LadderSearcher(
        _points(),
        ["lr"],
        list(replicates),
        {16: 0, 32: 1},
        ok=lambda r: r["status"] == "ok",
        bracket=bracket,
        ladder_base={"steps": 12, "batch_size": 8},
    )


def _bowl(opt):
    return lambda lr: (math.log(lr) - math.log(opt)) ** 2


def test_an_arm_whose_optimum_is_beyond_the_grid_is_extended_until_bracketed_then_replicated():
    ran = _drive(_searcher(), _bowl(0.15))  # above 0.1: the grid's top is an edge
    arm = [p for p in ran if p["steps"] == 24]
    extra = sorted({p["lr"] for p in arm} - set(GRID))
    assert extra == pytest.approx([0.1 * 0.1 / 0.03]), extra  # one step (×3.33) beyond 0.1: 0.1 is now inside
    assert sorted(p["seed"] for p in arm if p["lr"] == extra[0] and not p["replicate"]) == [0, 1]  # the grid's seeds
    reps = [p for p in arm if p["replicate"]]
    assert {p["lr"] for p in reps} == {0.1} and sorted(p["seed"] for p in reps) == [7, 8]
    # an optimum further out: extended again, and the replicates run at the new best
    ran = _drive(_searcher(), _bowl(0.3))
    arm = [p for p in ran if p["steps"] == 24]
    assert sorted({p["lr"] for p in arm} - set(GRID)) == pytest.approx([0.1 * 10 / 3, 0.1 * (10 / 3) ** 2])
    assert [p["lr"] for p in arm if p["replicate"]] == pytest.approx([0.1 * 10 / 3] * 2)
    first_rep = next(i for i, p in enumerate(ran) if p["replicate"] and p["steps"] == 24)
    assert all(i < first_rep for i, p in enumerate(ran) if p["steps"] == 24 and not p["replicate"])
    # the width ladder's own grid is left as given, its edge too
    ladder = [p for p in ran if p["steps"] == 12]
    assert {p["lr"] for p in ladder} == set(GRID) and {p["lr"] for p in ladder if p["replicate"]} == {0.1}


def test_bracketing_stops_at_its_limit_and_not_at_all_inside_the_grid_or_under_divergence():
    far = _drive(_searcher(bracket=2), _bowl(100.0))
    assert sorted({p["lr"] for p in far if p["steps"] == 24} - set(GRID)) == pytest.approx([0.1 * 10 / 3, 0.1 * (10 / 3) ** 2])
    low = _drive(_searcher(bracket=1), _bowl(1e-4))
    assert sorted({p["lr"] for p in low if p["steps"] == 24} - set(GRID)) == pytest.approx([0.01 * 0.01 / 0.03])
    inside = _drive(_searcher(), _bowl(0.03))
    assert {p["lr"] for p in inside} == set(GRID)
    off = _drive(_searcher(bracket=0), _bowl(0.25))
    assert {p["lr"] for p in off} == set(GRID)
    # the top value diverged: the best ok point (0.03) is not an edge of what the arm tried
    capped = _drive(_searcher(), _bowl(0.25), diverge_above=0.05)
    assert {p["lr"] for p in capped} == set(GRID)


def test_the_bracketing_state_survives_a_checkpoint_and_an_older_state_resumes(tmp_path):
    s = _searcher()
    ran = []
    for i in range(20):  # until the arm's grid is done and its edge extension is queued
        p = s.suggest(f"t{i}")
        ran.append(p)
        s.on_trial_complete(f"t{i}", {"val_loss": _bowl(0.25)(p["lr"]), "status": "ok"})
        if any(q["lr"] not in GRID for q in s.queue):
            break
    assert any(q["lr"] not in GRID for q in s.queue)
    s.save(str(tmp_path / "state.pkl"))
    again = _searcher()
    again.restore(str(tmp_path / "state.pkl"))
    assert again.queue == s.queue and again.extended == s.extended
    assert _drive(again, _bowl(0.25)) == _drive(s, _bowl(0.25))  # the same trials to the end
    # a state saved before bracketing existed (no `extended`) resumes: what each arm tried is in its rows
    older = {k: v for k, v in _searcher().get_state().items() if k != "extended"}
    resumed = _searcher()
    resumed.set_state(older)
    assert {p["lr"] for p in _drive(resumed, _bowl(0.15)) if p["steps"] == 24} - set(GRID)


def test_the_results_check_accepts_the_bracketing_values_and_no_others():
    d = tiny_spec_dict(sweep={"grid": {"lr": GRID}, "axes": {"steps": [24]}})
    spec = parse_spec(d)
    h = sweep_hash(spec)

    def table(lrs):
        return pd.DataFrame({"width": 16, "lr": lrs, "seed": 0, "val_loss": 1.0, "status": "ok", "spec_hash": h})

    check_results_belong(table([*GRID, 0.1 * 10 / 3, 0.1 * (10 / 3) ** 2, 0.01 * 0.01 / 0.03]), spec, h, "t")
    with pytest.raises(ResultsError, match="not in sweep.grid.lr"):
        check_results_belong(table([*GRID, 0.2]), spec, h, "t")
    with pytest.raises(ResultsError, match="not in sweep.grid.lr"):  # a third step: beyond bracket=2
        check_results_belong(table([*GRID, 0.1 * (10 / 3) ** 3]), spec, h, "t")


def test_arms_run_mid_ladder_by_default_and_old_studies_keep_their_hashes_where_their_trials_are_the_same():
    assert mid_width([64, 16, 32]) == 32 and mid_width([16, 32]) == 16 and mid_width([8, 16, 32, 64]) == 16

    def spec(widths, **axes):
        return parse_spec(tiny_spec_dict(sweep={"widths": widths, "axes": {"steps": [24], **axes}}))

    three, named = spec([16, 32, 64]), spec([16, 32, 64], width=16)
    assert three.axes_width == 32 and named.axes_width == 16
    assert sweep_hash(three) != sweep_hash(named)  # the default's arms now run at another width
    # two widths: the middle is the narrowest, the trials are the old default's and so is the hash
    two = spec([16, 32])
    assert two.axes_width == 16
    assert sweep_hash(two) == sweep_hash(spec([16, 32], bracket=2))  # bracket at its default is not hashed
    assert sweep_hash(two) != sweep_hash(spec([16, 32], bracket=0))
    with pytest.raises(Exception, match="sweep.axes.bracket"):
        spec([16, 32], bracket=-1)
