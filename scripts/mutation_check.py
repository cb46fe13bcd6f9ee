"""Mutation checks for issue 35: each mended test must fail on deliberately broken product code.

Usage: git worktree add /tmp/mut HEAD; .venv/bin/python scripts/mutation_check.py /tmp/mut [M1 M4 ...]
Each mutation edits one product file in that worktree, runs the tests that should catch it with
PYTHONPATH at the worktree's platform/, records whether they failed (caught), and restores the file.
MUT_OLD=1 runs the tests as they were before the mend (their old ids); MUT_OUT names the JSON written.
The slow ones (M5-M7) run a whole `hpt run` each (minutes)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(sys.argv[1])
ONLY = set(sys.argv[2:])
P = "platform/hptransfer/"
MUTATIONS = [
    (
        "M1",
        P + "transfer/results.py",
        '    if problems:\n        raise ResultsError(source, problems)\n    df["width"]',
        "    if problems:\n        raise ValueError('; '.join(problems))\n    df[\"width\"]",
        ["tests/test_axes.py::test_a_results_table_with_bad_axis_values_is_refused"],
    ),
    (
        "M2",
        P + "status.py",
        'raise StudyError(f"{study_dir} is not a folder',
        'raise NotADirectoryError(f"{study_dir} is not a folder',
        ["tests/test_status.py::test_not_a_folder_is_a_user_error"],
    ),
    (
        "M3",
        P + "transfer/rules.py",
        '"weight_decay": m if weight_decay_scaling == "independent" else 1.0}',
        '"weight_decay": m**0.5 if weight_decay_scaling == "independent" else 1.0}',
        ["tests/test_transfer_rule_training.py::test_every_rule_carries_what_it_changes_in_training"],
    ),
    (
        "M4",
        P + "models/depth.py",
        "return self.ratio ** (self.alpha - 1)",
        "return self.ratio ** (-self.alpha)",
        ["tests/test_depth.py"],
    ),
    (
        "M9",
        P + "dp/steps.py",
        "    beta, icpt = np.polyfit(lb - math.log(ref), ll, 1)\n    return float(beta), float(math.exp(icpt)), ref",
        "    return 0.5, float(math.exp(ll.mean())), ref",
        ["tests/test_dp_measured_rules.py::test_the_dp_sweep_table_feeds_the_plan"],
    ),
    (
        "M10",
        P + "dp/train.py",
        "        generator=torch.Generator().manual_seed(seed),\n    )",
        "        generator=None,\n    )",
        ["tests/test_dp_measured_rules.py::test_the_noise_free_arm_is_the_same_run_without_noise"],
    ),
    (
        "M11",
        P + "dp/width.py",
        "half = float(student.ppf(0.975, len(xs) - 1)) * sd / math.sqrt(len(xs))",
        "half = 1.96 * sd / math.sqrt(len(xs))",
        ["tests/test_dp_width.py"],
    ),
    (
        "M13",
        P + "handoff/to_torchtitan.py",
        '    except ImportError as e:\n        return path, [*notes, f"torchtitan: not installed',
        "    except ImportError as e:\n        path.write_text('')\n        return path, [*notes, f\"torchtitan: not installed",
        ["tests/test_handoff_trainers.py::test_files_are_written_unchecked_without_torchtitan_and_megatron"],
    ),
    (
        "M14",
        P + "handoff/fold.py",
        "mults[n] = (lr_of[id(src)] * a, weight_decay_mults[id(src)] / a, eps_of[id(src)] / a)",
        "mults[n] = (lr_of[id(src)], weight_decay_mults[id(src)] / a, eps_of[id(src)] / a)",
        ["tests/test_handoff_conformance.py::test_a_trainer_without_hptransfer_reproduces_the_mup_models_losses"],
        ["tests/test_handoff_conformance.py::test_a_trainer_without_hptransfer_reproduces_the_losses"],
    ),
    (
        "M15",
        P + "handoff/to_torch.py",
        'path = write_atomic(out / "hf_trainer.py", HF_TRAINER_SOURCE)',
        'path = write_atomic(out / "hf_trainer.py", HF_TRAINER_SOURCE.replace(\'max_grad_norm=spec["grad_clip"]\', "max_grad_norm=0.0"))',
        ["tests/test_handoff_conformance.py::test_a_transformers_trainer_run_from_the_handoff_matches_the_conformance_losses"],
    ),
    # slow: a whole hpt run each
    (
        "M5",
        P + "transfer/rules.py",
        "    return target.width if target.width in ev.optima else max(ev.optima)",
        "    return target.width if target.width in ev.optima else min(ev.optima)",
        ["tests/test_pipeline.py::test_hpt_run_end_to_end"],
    ),
    (
        "M6",
        P + "transfer/axes.py",
        '            verdict="undecided" if two else "fitted",',
        '            verdict="fitted",',
        ["tests/test_axes_run.py"],
    ),
    ("M7", P + "dp/width.py", "        if all(same.values()):", "        if False:", ["tests/test_dp_finetune.py"]),
]
env = {**os.environ, "PYTHONPATH": str(ROOT / "platform")}
results = {}
OLD = os.environ.get("MUT_OLD") == "1"  # run the tests as they were before the mend (a worktree at HEAD)
for name, rel, old, new, tests, *old_tests in MUTATIONS:
    if ONLY and name not in ONLY:
        continue
    if OLD and old_tests:
        tests = old_tests[0]
    f = ROOT / rel
    text = f.read_text()
    assert text.count(old) == 1, (name, rel, text.count(old))
    f.write_text(text.replace(old, new))
    t0 = time.time()
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "slow or not slow", *tests],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
        )
        tail = [ln for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR")) or " passed" in ln or " failed" in ln][
            -3:
        ]
        results[name] = {
            "file": rel,
            "tests": tests,
            "rc": r.returncode,
            "caught": r.returncode == 1,
            "tail": tail,
            "s": round(time.time() - t0),
        }
    finally:
        f.write_text(text)
    print(name, results[name], flush=True)
out = Path(os.environ.get("MUT_OUT", "mutation_results.json"))
old_res = json.loads(out.read_text()) if out.exists() else {}
out.write_text(json.dumps({**old_res, **results}, indent=1))
