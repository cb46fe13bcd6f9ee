"""The benchmarks stay runnable without running them: every script imports and answers `--help`
without starting its work, the helpers they share (benchmarks/common.py) compute what they say, and
the library hooks they use instead of patching internals (a trial order for `run_sweep`, an LR
factor for `train_proxy`) do what the benchmarks rely on. Fast: no Ray, no benchmark run."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT, tiny_spec_dict

BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "common")

sys.path.insert(0, str(BENCH))  # the scripts import each other as `common`, `transfer_regret`
import common  # noqa: E402


def test_the_script_list_is_what_the_readme_expects():
    # A renamed or removed benchmark must be noticed here (and in benchmarks/README.md).
    assert {
        "transfer_regret",
        "paper_claims",
        "sweep_overhead",
        "dp_lm",
        "quickstart",
        "make_benchmarks_md",
        "depth_regret",
        "joint_regret",
        "default_regret",
    } <= set(SCRIPTS)


@pytest.mark.parametrize("stem", SCRIPTS)
def test_every_benchmark_module_imports(stem):
    mod = importlib.import_module(stem)
    assert callable(getattr(mod, "main", None)), f"benchmarks/{stem}.py has no main()"


def test_every_benchmark_answers_help_without_running():
    """One process per script, as a user runs it: `--help` must print the usage and exit 0 before
    any work starts (a script without argparse would start its benchmark here and time out)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "platform")}
    procs = {
        stem: subprocess.Popen(
            [sys.executable, str(BENCH / f"{stem}.py"), "--help"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for stem in SCRIPTS
    }
    for stem, p in procs.items():
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            pytest.fail(f"benchmarks/{stem}.py --help did not exit within 120 s: it runs the benchmark")
        text = out.decode()
        assert p.returncode == 0 and "usage:" in text, (stem, text[-2000:])


def test_benchmarks_md_is_what_the_results_give():
    """BENCHMARKS.md is generated, never typed: a result or a generator edited without regenerating
    it fails here (and the page renders the same on a fresh clone: no file times in it)."""
    import make_benchmarks_md

    assert make_benchmarks_md.render() == (ROOT / "BENCHMARKS.md").read_text(), (
        "rerun .venv/bin/python benchmarks/make_benchmarks_md.py"
    )


# --- intervals and verdicts ---------------------------------------------------------------------


def test_t_interval_matches_the_closed_form_for_two_degrees_of_freedom():
    # For 2 dof the t quantile has a closed form: t_p = (2p − 1) / √(2p(1 − p)).
    t975 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    ci = common.t_interval([1.0, 2.0, 3.0])  # mean 2, sd 1
    half = t975 * 1.0 / math.sqrt(3)
    assert (ci.mean, ci.n) == (2.0, 3)
    assert ci.lo == pytest.approx(2 - half, abs=1e-9) and ci.hi == pytest.approx(2 + half, abs=1e-9)
    assert ci.as_dict() == {"mean": 2.0, "lo": ci.lo, "hi": ci.hi, "n": 3}


def test_one_value_has_no_interval():
    ci = common.t_interval([0.5])
    assert (ci.mean, ci.lo, ci.hi, ci.n) == (0.5, -math.inf, math.inf, 1)
    assert ci.as_dict() == {"mean": 0.5, "lo": None, "hi": None, "n": 1}  # JSON has no inf


def test_verdict_reads_the_whole_interval():
    assert common.verdict(-0.004, 0.006, inside=(-0.01, 0.01)) == "reproduced"
    assert common.verdict(0.02, 0.03, inside=(-0.01, 0.01)) == "not reproduced"
    assert common.verdict(0.005, 0.02, inside=(-0.01, 0.01)) == "inconclusive"
    assert common.verdict(-0.3, -0.1, below=0.0) == "reproduced"
    assert common.verdict(0.0, 0.2, below=0.0) == "not reproduced"
    assert common.verdict(-0.1, 0.1, below=0.0) == "inconclusive"
    assert common.verdict(None, 0.1, below=0.0) == "inconclusive"


# --- the run cache ---------------------------------------------------------------------------------


def test_run_cache_trains_each_missing_key_once_and_resumes_after_a_cut_line(tmp_path, capsys):
    path = tmp_path / "runs.jsonl"
    keys = [{"width": w, "seed": 0} for w in (8, 32, 16)]
    cache = common.RunCache(path)
    # `dict` as the trainer: a run's result is its key (picklable for the spawned pool).
    res = cache.run([*keys, keys[0]], dict, procs=1, first=lambda k: -k["width"])
    assert cache.trained == 3  # the duplicate key is trained once
    assert res == {common.key_str(k): k for k in keys}
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [r["width"] for r in lines] == [32, 16, 8]  # widest first, as `first` says

    # A killed run leaves a line cut short: it is skipped and that run (only) is trained again.
    path.write_text("".join(json.dumps(r) + "\n" for r in lines[:2]) + json.dumps(lines[2])[:10])
    again = common.RunCache(path)
    assert again.run(keys, dict, procs=1) == res
    assert again.trained == 1

    # Re-plan only: everything cached passes; a missing run is refused with its key and the fix.
    assert common.RunCache(path, train=False).run(keys, dict, procs=1) == res
    with pytest.raises(SystemExit, match=r'1 of 4 runs are not in the run cache .*"width": 64.*Drop --cached-only'):
        common.RunCache(path, train=False).run([*keys, {"width": 64, "seed": 0}], dict, procs=1)


def test_run_cache_trains_in_a_pool_it_is_given_and_leaves_it_open(tmp_path):
    # joint_regret.py trains in many two-run rounds: one pool for all of them, not one per round.
    import multiprocessing as mp

    path = tmp_path / "runs.jsonl"
    with mp.get_context("spawn").Pool(1) as pool:
        cache = common.RunCache(path)
        a = cache.run([{"width": 8, "seed": 0}], dict, procs=1, pool=pool)
        b = cache.run([{"width": 16, "seed": 0}], dict, procs=1, pool=pool)  # the same pool, still open
        assert pool.apply(abs, (-3,)) == 3
    assert cache.trained == 2 and len(a) == len(b) == 1
    assert [json.loads(ln)["width"] for ln in path.read_text().splitlines()] == [8, 16]


def test_joint_regret_reads_a_paired_difference_from_its_interval():
    import joint_regret

    assert joint_regret.direction(-0.3, -0.1) == "better"
    assert joint_regret.direction(0.1, 0.3) == "worse"
    assert joint_regret.direction(-0.1, 0.2) == "inconclusive"
    assert joint_regret.direction(None, None) == "inconclusive"
    # x − y by seed over the common seeds; relative: divided by y's mean there.
    p = joint_regret.paired({0: 2.0, 1: 2.2, 2: 9.0}, {0: 2.1, 1: 2.4})
    assert p["seeds"] == [0, 1] and p["mean"] == pytest.approx(-0.15) and p["verdict"] == "inconclusive"
    r = joint_regret.paired({0: 2.2, 1: 2.2}, {0: 2.0, 1: 2.0}, relative=True)
    assert r["per_seed"] == pytest.approx([0.1, 0.1])
    assert joint_regret.paired({0: 1.0}, {0: 2.0}) is None  # one seed: no interval


def test_run_cache_keys_ignore_fields_outside_the_key(tmp_path):
    # A cached line holds the key's fields and its figures; the key is read back from the key's fields.
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps({"seed": 1, "width": 8, "val_loss": 2.5}) + "\n")
    got = common.RunCache(path, train=False).run([{"width": 8, "seed": 1}], dict, procs=1)
    assert got == {common.key_str({"width": 8, "seed": 1}): {"seed": 1, "width": 8, "val_loss": 2.5}}


# --- the library hooks the benchmarks use ----------------------------------------------------------


def test_trial_order_is_an_argument_of_the_sweep():
    from hptransfer.spec import parse_spec
    from hptransfer.sweep.runner import TRIAL_ORDERS, ordered_widths, replicate_points

    assert ordered_widths([16, 64, 32]) == [64, 32, 16]  # the default: widest first
    assert ordered_widths([16, 64, 32], "ascending") == [16, 32, 64]
    with pytest.raises(ValueError, match="order must be one of widest-first, ascending, got 'narrow'"):
        ordered_widths([16], "narrow")
    assert TRIAL_ORDERS == ("widest-first", "ascending")

    spec = parse_spec(tiny_spec_dict(sweep={"widths": [16, 32], "grid": {"lr": [0.01, 0.1]}, "noise_seeds": 2}))
    df = pd.DataFrame(
        [
            {"width": w, "lr": lr, "seed": 0, "val_loss": loss, "status": "ok"}
            for w, lr, loss in [(16, 0.01, 3.0), (16, 0.1, 2.0), (32, 0.01, 1.0), (32, 0.1, 4.0)]
        ]
    )
    wide = replicate_points(spec, df)
    assert [(p["width"], p["lr"], p["seed"]) for p in wide] == [(32, 0.01, 1), (32, 0.01, 2), (16, 0.1, 1), (16, 0.1, 2)]
    narrow = replicate_points(spec, df, "ascending")
    assert [(p["width"], p["lr"], p["seed"]) for p in narrow] == [(16, 0.1, 1), (16, 0.1, 2), (32, 0.01, 1), (32, 0.01, 2)]


def test_an_lr_factor_passed_to_a_trial_reaches_its_schedule():
    """What benchmarks/transfer_regret.py passes for `sp-warmup`: a factor of 1 changes nothing (bit
    for bit), a factor of 0 freezes the weights, so the trial ends on its untrained model's loss."""
    import torch

    from hptransfer.data import open_corpus
    from hptransfer.hyperparameters import Hyperparameters
    from hptransfer.models import evaluate, training_setup
    from hptransfer.spec import parse_spec
    from hptransfer.sweep.trial import train_proxy

    torch.set_num_threads(1)
    spec = parse_spec(tiny_spec_dict(sweep={"steps": 4, "batch_size": 4}, data={"max_files": 20, "eval_batches": 1}))
    hps = Hyperparameters(lr=0.05, weight_decay=0.1, warmup_steps=0)
    plain = train_proxy(spec, 16, hps, seed=0, n_reports=1)
    one = train_proxy(spec, 16, hps, seed=0, n_reports=1, extra_lr_factor=lambda s: 1.0)

    def figures(m: dict) -> dict:
        return {k: v for k, v in m.items() if k not in ("wall_s", "train_s")}

    assert figures(one) == figures(plain) and plain["status"] == "ok"
    frozen = train_proxy(spec, 16, hps, seed=0, n_reports=1, extra_lr_factor=lambda s: 0.0)

    corpus = open_corpus(spec.data, seq_len=spec.model.seq_len, steps=spec.sweep.steps, batch_size=spec.sweep.batch_size)
    val = corpus.val_batches(spec.data.eval_batches, spec.sweep.batch_size, spec.model.seq_len)
    init = training_setup(spec.model, 16, base_width=spec.base_width, hps=hps, total_steps=4, seed=0).model
    untrained = evaluate(init, val, spec.sweep.precision)
    assert frozen["val_loss"] == pytest.approx(untrained, abs=1e-6)
    assert abs(plain["val_loss"] - untrained) > 1e-3  # 4 steps at lr 0.05 do move the loss


def test_the_sweep_task_carries_the_order_and_actor_reuse_it_is_given(ray_local, tmp_path):
    """What sweep_overhead.py's what-ifs pass to `run_sweep`: the width axis in the asked order (the
    order trials start in) and `reuse_actors` for Tune."""
    from hptransfer.study import Study
    from hptransfer.sweep.runner import lm_sweep_task

    study = Study.from_spec(tiny_spec_dict(sweep={"widths": [16, 32, 64]}), tmp_path / "s")
    default = lm_sweep_task(study)
    assert default.axes["width"] == [64, 32, 16] and default.reuse_actors is True
    what_if = lm_sweep_task(study, order="ascending", reuse_actors=False)
    assert what_if.axes["width"] == [16, 32, 64] and what_if.reuse_actors is False
