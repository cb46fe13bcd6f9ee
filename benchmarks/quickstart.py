"""The quickstart, timed and judged: `hpt run search_spaces/quickstart.yaml` over 3 seeds.

For each seed s, a copy of the quickstart spec with `seed: s` and `sweep.seeds: [s]` (the ladder's
grid seed; its noise replicates follow) runs as the README's user runs it — the `hpt run` command
in a fresh process and a fresh study folder, so the wall time includes imports, Ray's start and
MLflow. Recorded per seed: the wall time and the stage times `hpt run` prints, the target's final
validation loss, the ladder's best (seed-averaged) loss, the plan's predicted target-loss interval,
and `transfer.target_check.check_target`'s verdict — the same check `hpt run` prints.

Goals (issues 12 and 15): `hpt run` ≤ 180 s on 2 cores; over the 3 seeds the 4×-wider target beats
its ladder's best and lands inside the predicted interval. The verdicts are computed by
benchmarks/make_benchmarks_md.py from the per-seed figures.

Run: .venv/bin/python benchmarks/quickstart.py   → benchmarks/results/quickstart.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _ladder_best(csv: Path) -> dict[str, float]:
    """Each width's best seed-averaged loss over its grid points (replicates included)."""
    import pandas as pd

    df = pd.read_csv(csv)
    ok = df[df.status == "ok"]
    return {str(w): float(g.groupby("lr")["val_loss"].mean().min()) for w, g in ok.groupby("width")}


def run_seed(spec: dict, seed: int, work: Path) -> dict:
    from hptransfer.plan import load_plan
    from hptransfer.transfer.target_check import check_target

    d = work / f"seed{seed}"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    s = json.loads(json.dumps(spec))
    s["seed"] = seed
    s["sweep"]["seeds"] = [seed]
    spec_path = d / "quickstart.yaml"
    spec_path.write_text(yaml.safe_dump(s, sort_keys=False))
    study = d / "study"
    hpt = Path(sys.executable).with_name("hpt")
    t0 = time.perf_counter()
    r = subprocess.run([str(hpt), "run", str(spec_path), "--study-dir", str(study)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (d / "stdout.txt").write_text(r.stdout + "\n--- stderr ---\n" + r.stderr)
    if r.returncode != 0:
        return {"seed": seed, "wall_s": wall, "returncode": r.returncode, "error": (r.stderr or r.stdout)[-2000:]}
    m = re.search(r"times: (.+)", r.stdout)
    times = {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split(", "))} if m else {}
    plan = load_plan(study / "transfer_plan.yaml")
    final = json.loads((study / "train" / "train_metrics.json").read_text())["final"]
    diag = plan.diagnostics.model_dump(mode="json")  # the same JSON as the plan file
    check = check_target(plan.diagnostics, final.get("val_loss"))
    console_lines = r.stdout.count("\n") + r.stderr.count("\n")
    return {
        "seed": seed,
        "returncode": 0,
        "wall_s": round(wall, 1),
        "stage_times_s": {k: round(v, 1) for k, v in times.items()},
        "target_val_loss": final.get("val_loss"),
        "ladder_best_loss": diag.get("ladder_best_loss"),
        "ladder_best_loss_by_width": _ladder_best(study / "sweep_results.csv"),
        "predicted_target_loss": diag.get("predicted_target_loss"),
        "predicted_target_loss_interval": diag.get("predicted_target_loss_interval"),
        "transferred_lr": plan.hps.lr,
        "hyperparameters": {k: plan.hps.as_dict()[k] for k in ("lr", "output_mult", "init_std", "warmup_steps")},
        "fast_transfer": diag.get("fast_transfer"),
        "check": check,
        "console_lines": console_lines,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    ap.add_argument("--spec", type=Path, default=ROOT / "search_spaces" / "quickstart.yaml")
    ap.add_argument("--work", type=Path, default=Path("/tmp/hpt_quickstart_bench"), help="study folders (kept for inspection)")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default: results/quickstart.json; with --hp-defaults package: quickstart_package_defaults.json)",
    )
    ap.add_argument(
        "--hp-defaults",
        choices=["family", "package"],
        default=None,
        help="set model.hp_defaults in the spec copy (package: the quickstart as it ran before issue 36's family defaults)",
    )
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = RESULTS / ("quickstart_package_defaults.json" if args.hp_defaults == "package" else "quickstart.json")
    from hptransfer.io import write_json

    from common import machine_info

    spec = yaml.safe_load(args.spec.read_text())
    if args.hp_defaults:
        spec["model"] = {**spec.get("model", {}), "hp_defaults": args.hp_defaults}
    machine = machine_info(
        argv=[Path(__file__).name, *(argv if argv is not None else sys.argv[1:])],
        note="2-core VM; nothing else ran during the timing",
    )
    t0 = time.perf_counter()
    runs = []
    for seed in (int(x) for x in args.seeds.split(",")):
        r = run_seed(spec, seed, args.work)
        runs.append(r)
        print(
            f"seed {seed}: {r['wall_s']:.0f} s"
            + (
                f", target {r['target_val_loss']:.4f} vs ladder best {r['ladder_best_loss']:.4f}, "
                f"predicted {r['predicted_target_loss_interval']} → {r['check']['verdict']}"
                if r["returncode"] == 0
                else f", FAILED: {r['error'][-300:]}"
            ),
            flush=True,
        )
    out = {
        "setting": {
            "spec": str(args.spec.relative_to(ROOT) if args.spec.is_relative_to(ROOT) else args.spec),
            "widths": spec["sweep"]["widths"],
            "target": spec["target"]["width"],
            "sweep_steps": spec["sweep"]["steps"],
            "target_steps": spec["target"]["steps"],
            "batch": spec["sweep"]["batch_size"],
            "noise_seeds": spec["sweep"].get("noise_seeds"),
            "goal_wall_s": 180,
        },
        "machine": machine,
        "date": machine["date_utc"],
        "command": ".venv/bin/python benchmarks/quickstart.py"
        + (f" --seeds {args.seeds}" if args.seeds != "0,1,2" else "")
        + (f" --hp-defaults {args.hp_defaults}" if args.hp_defaults else ""),
        "hp_defaults": args.hp_defaults or "family",
        "hyperparameters": [r.get("hyperparameters") for r in runs],
        "runs": runs,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
