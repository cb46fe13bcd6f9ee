"""`sweep.search: optuna` (issue 25, item 1): the spec's box and budget, validated; the searcher that
hands out each width's Optuna (TPE) points through Ray Tune's OptunaSearch, then its replicates,
with a concurrency limit, diverged trials told as the worst loss, and its state surviving a resume.
Driven here by a plain loop standing in for Tune's (fast: no Ray runtime)."""

import copy
import math
import os
import re
import signal

import numpy as np
import pandas as pd
import pytest

from hptransfer.hyperparameters import LOG_SCALE
from hptransfer.layout import SWEEP_EXPERIMENT
from hptransfer.spec import SpecError, parse_spec, sweep_hash
from hptransfer.sweep.search import OptunaLadderSearcher, optuna_space

LR, OM = 3e-3, 1.4
BOX = {"lr": [1e-4, 1e-1], "output_mult": [0.25, 8.0]}


def loss(point):
    u, v = math.log(point["lr"] / LR), math.log(point["output_mult"] / OM)
    return 2 + 4 * point["width"] ** -0.5 + 0.1 * u * u + 0.36 * u * v + 0.4 * v * v


def regret(point):
    """Loss above the optimum at that width (a diverged point: the worst a trial here reaches, ~3)."""
    return loss({**point, "width": 1}) - loss({"lr": LR, "output_mult": OM, "width": 1}) if point["lr"] <= 5e-2 else 3.0


def result(point):
    if point["lr"] > 5e-2:  # the edge of stability
        return {"status": "diverged", "val_loss": math.nan}
    return {"status": "ok", "val_loss": loss(point)}


def searcher(budget=16, max_concurrent=2, warm_start=3, widths=(32, 64), sampler_seed=0):
    """Narrowest first, as the runner builds it; `budget` an int (every width) or a list per width."""
    return OptunaLadderSearcher(
        [{"width": w} for w in widths],
        BOX,
        LOG_SCALE,
        budget,
        0,
        [1, 2],
        {w: i for i, w in enumerate(widths)},
        max_concurrent=max_concurrent,
        sampler_seed=sampler_seed,
        warm_start=warm_start,
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
    handed, peak, _ = drive(searcher(budget=[16, 8], max_concurrent=2))
    assert peak == 2
    for w, budget in ((32, 16), (64, 8)):
        searched = [p for p in handed if p["width"] == w and not p["replicate"]]
        reps = [p for p in handed if p["width"] == w and p["replicate"]]
        assert len(searched) == budget and all(p["seed"] == 0 for p in searched)
        assert all(BOX[hp][0] <= p[hp] <= BOX[hp][1] for p in searched for hp in BOX)
        ok = [p for p in searched if p["lr"] <= 5e-2]
        best = min(ok, key=loss)
        assert [r["seed"] for r in reps] == [1, 2] and all(r["lr"] == best["lr"] for r in reps)
        assert len({p["lr"] for p in searched}) == budget  # not a grid: every point its own
    # Narrowest first (each width starts from the narrower one), every replicate after its width's budget.
    assert handed[0]["width"] == 32
    for w in (32, 64):
        last = max(i for i, p in enumerate(handed) if p["width"] == w and not p["replicate"])
        assert min(i for i, p in enumerate(handed) if p["width"] == w and p["replicate"]) > last


def test_tpe_concentrates_near_the_optimum_on_the_log_scale():
    """After the random start-up trials, TPE's points sit closer to the optimum than random ones
    (distance in log units): the sampler is told the losses, on the declared scale."""
    s = searcher(budget=40, max_concurrent=1)
    handed, _, _ = drive(s)
    pts = [p for p in handed if p["width"] == 32 and not p["replicate"]]
    dist = [math.hypot(math.log(p["lr"] / LR), math.log(p["output_mult"] / OM)) for p in pts]
    early, late = np.mean(dist[:8]), np.mean(dist[-12:])
    assert late < 0.6 * early, (early, late)
    dists = optuna_space(BOX, LOG_SCALE)
    assert dists["lr"].log and dists["output_mult"].log  # both log-scale tunables
    assert not optuna_space({"warmup_steps": [0, 100]}, LOG_SCALE)["warmup_steps"].log


def test_a_diverged_trial_is_told_as_the_worst_loss_and_a_failed_one_as_a_failure():
    s = searcher(budget=6, max_concurrent=1)
    for tid, r in [
        ("a", {"status": "ok", "val_loss": 3.0}),
        ("b", {"status": "ok", "val_loss": 2.5}),
        ("c", {"status": "diverged", "val_loss": math.nan}),  # "too high": the worst seen at this width
        ("d", None),  # a crash: no information
    ]:
        s.suggest(tid)
        s.on_trial_complete(tid, r, error=r is None)
    narrow = s.studies[0]._ot_study.trials
    assert [(t.state.name, t.value) for t in narrow] == [("COMPLETE", 3.0), ("COMPLETE", 2.5), ("COMPLETE", 3.0), ("FAIL", None)]


def test_the_state_survives_a_resume_and_continues_as_if_uninterrupted(tmp_path):
    """Tune saves the searcher with its experiment state (save/restore); a restored searcher, its
    Optuna studies and the warm start included, hands out exactly what the uninterrupted one would
    have: stopped in the narrowest width's search, in the wider width's anchors, and after its
    transfer (budgets 16 and 8, 3 anchors: the wider width's trials are the 17th to 24th)."""
    whole, _, _ = drive(searcher(budget=[16, 8]))
    for stop in (13, 18, 21):
        first = searcher(budget=[16, 8])
        part, _, live = drive(first, stop_after=stop)
        first.save(str(tmp_path / "searcher.pkl"))
        again = searcher(budget=[16, 8])
        again.restore(str(tmp_path / "searcher.pkl"))
        rest, _, _ = drive(again, start=stop, live=live)
        assert part + rest == whole, stop
    assert isinstance(again.offset[1], float)  # the restored run did transfer


def test_a_wider_width_starts_at_the_narrower_optimum_with_its_trials_shifted_by_the_measured_offset():
    """The ladder as fidelity: the wider width's first points are the narrower width's best ones;
    then its study holds the narrower width's trials at their loss plus the offset measured at
    those points: on this objective (the same bowl, a level falling with width) exactly the wider
    width's own loss there. Its first trials lose less than a cold start's (6 sampler seeds)."""
    first8, sampled = {True: [], False: []}, {True: [], False: []}
    for seed in range(6):
        for warm in (True, False):
            s = searcher(budget=[16, 8], warm_start=3 if warm else 0, sampler_seed=seed, max_concurrent=1)
            handed, _, _ = drive(s)
            narrow = [p for p in handed if p["width"] == 32 and not p["replicate"]]
            wide = [p for p in handed if p["width"] == 64 and not p["replicate"]]
            if warm:
                best3 = sorted([p for p in narrow if p["lr"] <= 5e-2], key=loss)[:3]
                assert [(p["lr"], p["output_mult"]) for p in wide[:3]] == [(p["lr"], p["output_mult"]) for p in best3]
                assert s.offset[1] == pytest.approx(loss({**best3[0], "width": 64}) - loss(best3[0]))
                own = [{hp: p[hp] for hp in BOX} for p in wide]
                told = [t for t in s.studies[1]._ot_study.trials if t.params not in own]
                # every other narrow trial with a value: ok, or diverged once the width has a worst loss
                valued = [i for i, p in enumerate(narrow) if any(q["lr"] <= 5e-2 for q in narrow[: i + 1])]
                assert len(told) == len(valued) - 3
                for t in told:
                    if t.params["lr"] <= 5e-2:
                        assert t.value == pytest.approx(loss({**t.params, "width": 64}))
            else:
                assert s.offset[1] == "none" and len(s.studies[1]._ot_study.trials) == 8
            first8[warm] += [regret(p) for p in wide[:8]]
            sampled[warm] += [regret(p) for p in (wide[3:8] if warm else wide[:5])]
    assert np.mean(first8[True]) < 0.5 * np.mean(first8[False]), first8
    # TPE after the transfer, beyond the anchors (it is not very exploitative at 16 + 3 trials).
    assert np.median(sampled[True]) < 0.75 * np.median(sampled[False]), sampled


def test_budgets_fall_with_width_as_configured():
    o = _spec(search="optuna", optuna={"trials_per_width": 20, "budget_decay": 0.5}).sweep.optuna_settings
    assert o.budgets(4) == [20, 10, 5, 4]  # floored at the 3 anchors + 1
    assert _spec(search="optuna", optuna={"trials_per_width": 6, "budget_decay": 1.0}).sweep.optuna_settings.budgets(3) == [
        6,
        6,
        6,
    ]
    assert _spec(search="optuna", optuna={"trials_per_width": 8, "warm_start_points": 0}).sweep.optuna_settings.budgets(3) == [
        8,
        4,
        2,
    ]
    handed, _, _ = drive(searcher(budget=o.budgets(3), widths=(16, 32, 64)))
    assert [sum(p["width"] == w and not p["replicate"] for p in handed) for w in (16, 32, 64)] == [20, 10, 5]


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
    assert s.sweep.n_trials == 12 + 6 + 2 * 2 and s.sweep.optuna_settings.max_concurrent == 3
    assert _spec(search="optuna").sweep.optuna_settings.trials_per_width == 20  # defaults when omitted
    assert sweep_hash(_spec(search="optuna")) != sweep_hash(_spec())  # another sweep: not resumed as the grid
    for sweep, says in [
        ({"search": "optuna", "grid": {"lr": [1e-3, 1e-2, 1e-1]}}, "each sweep.grid entry is the box [low, high]"),
        ({"search": "optuna", "grid": {"lr": [1e-1, 1e-3]}}, "(low < high)"),
        ({"search": "optuna", "seeds": [0, 1]}, "runs one seed per point"),
        ({"optuna": {"trials_per_width": 5}}, "set `search: optuna` or remove sweep.optuna"),
        ({"search": "optuna", "optuna": {"trials_per_width": 1}}, "sweep.optuna.trials_per_width"),
        ({"search": "optuna", "optuna": {"max_concurent": 2}}, "max_concurent"),
        ({"search": "optuna", "optuna": {"budget_decay": 1.5}}, "sweep.optuna.budget_decay"),
        ({"search": "bayes"}, "sweep.search"),
    ]:
        with pytest.raises(SpecError, match=None) as e:
            _spec(**sweep)
        assert says in str(e.value), (sweep, str(e.value))


OPTUNA_LINE = re.compile(r"\[sweep \d+/\d+\] (replicate )?width=(\d+) lr=(\S+) output_mult=(\S+) seed=(\d+) -> (.*?) val_loss")


@pytest.mark.slow
def test_an_optuna_hpt_run_killed_and_resumed_from_the_cli_logs_to_mlflow_and_makes_a_joint_plan(mlflow_server, tmp_path):
    """End to end as a user runs it: `hpt run --until transfer` of a tiny MLP ladder (2 widths, 4
    then 3 TPE trials over lr × output_mult, the wider width from the narrower one's best 2, one
    replicate each, 2 at a time) against a real `mlflow server`, SIGKILLed with its Ray once 3 trials
    have finished; the same command again resumes it (the searcher's Optuna studies come back from
    Tune's experiment checkpoint), no finished trial trains again, the replicates run in that one
    Tune run, MLflow has one parent with one child per trial, and the plan fits the scattered points."""
    import subprocess
    import sys
    import time

    import mlflow
    import yaml

    from hptransfer.plan import load_plan
    from hptransfer.study import Study

    from conftest import tiny_spec_dict

    box = {"lr": [1e-3, 0.3], "output_mult": [0.5, 4.0]}
    spec = tiny_spec_dict(
        name="optuna-e2e",
        sweep={
            "grid": box,
            "search": "optuna",
            "optuna": {"trials_per_width": 4, "warm_start_points": 2, "max_concurrent": 2},
            "noise_seeds": 1,
            "steps": 40,  # ~0.5 s a trial: the kill lands mid-sweep
        },
    )
    spec_path, study_dir = tmp_path / "optuna.yaml", tmp_path / "study"
    spec_path.write_text(yaml.safe_dump(spec))
    cmd = [sys.executable, "-m", "hptransfer", "run", str(spec_path), "--study-dir", str(study_dir)]
    cmd += ["--skip-coord-check", "--until", "transfer", "--tracking-uri", mlflow_server]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    before, deadline = set(), time.time() + 300
    for line in p.stdout:
        if m := OPTUNA_LINE.search(line):
            before.add(m.groups()[1:5])
        if len(before) >= 3 or time.time() > deadline:
            break
    os.killpg(p.pid, signal.SIGKILL)  # the driver and the Ray it started
    p.wait()
    assert len(before) >= 3, "the sweep did not get going"
    assert not (study_dir / "sweep_results.csv").exists()

    log_file = Study.from_spec(spec_path, study_dir).paths.log_file
    log_size = log_file.stat().st_size
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # the same command, as a user retries it
    said = r.stdout + r.stderr
    assert r.returncode == 0, said[-5000:]
    assert "resuming the sweep" in said and "4/3 Optuna TPE trials" in said, said[-5000:]
    lines = log_file.read_text()[log_size:].splitlines()
    after = {m.groups()[1:5]: m.group(6) for m in map(OPTUNA_LINE.search, lines) if m}
    for trial in before:  # never trained twice: restored by Tune or replayed from its marker
        assert trial not in after or "not run again" in after[trial], (trial, after.get(trial))
    assert any("not run again" not in s for t, s in after.items() if t not in before), after  # it did train after the kill

    df = pd.read_csv(study_dir / "sweep_results.csv")
    assert len(df) == 4 + 3 + 2 and df.replicate.sum() == 2
    assert len(df.drop_duplicates(["width", "lr", "output_mult", "seed"])) == len(df)
    narrow, wide = (df[(df.width == w) & ~df.replicate] for w in (16, 32))
    assert len(narrow) == 4 and len(wide) == 3 and (df[~df.replicate].seed == 0).all()
    assert all(box[hp][0] <= v <= box[hp][1] for hp in box for v in df[hp])
    # The wider width started at 2 of the narrower one's points (its best finished by then).
    assert len(set(zip(narrow.lr, narrow.output_mult)) & set(zip(wide.lr, wide.output_mult))) == 2
    for searched in (narrow, wide):  # each replicate at its width's best point, with a new seed
        rep = df[df.replicate & (df.width == searched.width.iloc[0])]
        best = searched[searched.status == "ok"].nsmallest(1, "val_loss")
        assert rep.seed.tolist() == [1] and (rep.lr.iloc[0], rep.output_mult.iloc[0]) == (
            best.lr.iloc[0],
            best.output_mult.iloc[0],
        )
    ray_dirs = [d.name for d in Study.from_spec(spec_path, study_dir).paths.ray_storage.iterdir() if d.is_dir()]
    assert ray_dirs == [SWEEP_EXPERIMENT]  # one Tune run, resumed

    mlflow.set_tracking_uri(mlflow_server)
    runs = mlflow.search_runs(experiment_names=["optuna-e2e"])
    parents, children = runs[runs["tags.hpt.kind"] == "sweep"], runs[runs["tags.hpt.kind"] == "trial"]
    assert len(parents) == 1 and len(children) == len(df)  # the killed run logged nothing: it never finished
    assert (children["tags.mlflow.parentRunId"] == parents.run_id.iloc[0]).all()
    assert parents["params.search"].iloc[0] == "optuna"

    # The plan `hpt run` wrote fits the scattered points jointly, width by width; what each width's fit
    # says it saw is checked against the table itself.
    plan = load_plan(study_dir / "transfer_plan.yaml")
    assert set(plan.diagnostics.joint_by_width) == {"16", "32"}
    for width, joint in plan.diagnostics.joint_by_width.items():
        ok = df[(df.width == int(width)) & (df.status == "ok")]
        points = ok.groupby(["lr", "output_mult"])["val_loss"].mean()  # the replicate averaged with its point
        assert joint.hyperparameters == ["lr", "output_mult"] and joint.n_points == len(ok)
        assert joint.best_loss == pytest.approx(points.min(), rel=1e-9)
        assert all(box[hp][0] <= joint.value[hp] <= box[hp][1] for hp in box), joint.value
        if not joint.convex:  # the fallback is the best point itself
            assert (joint.value["lr"], joint.value["output_mult"]) == pytest.approx(points.idxmin(), rel=1e-12)
    # The target's lr: the widest width's joint optimum times the plan's lr heuristics (the horizon prior:
    # the sweep's 40 steps against the target's 6).
    factor = math.prod(h["factor"] for h in plan.heuristics if h["applies_to"] == "lr")
    assert plan.hps.lr == pytest.approx(plan.diagnostics.joint_by_width["32"].value["lr"] * factor, rel=1e-9)
    assert plan.diagnostics.per_hyperparameter["lr"].source_value == pytest.approx(
        plan.diagnostics.joint_by_width["32"].value["lr"], rel=1e-12
    )
