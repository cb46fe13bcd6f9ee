"""Platform overhead of `hpt sweep` (issue 3): how much of the machine a sweep spends outside the
trials' training steps, and how sweep time grows with the number of trials.

Workload: the real `run_sweep` (Ray Tune, one fresh Ray per sweep, exactly as `hpt sweep` runs it)
on 2 CPUs, 1 CPU per trial (2 trials at a time), a µP Llama proxy (depth 2, head_dim 16, seq 64,
batch 16) at widths 32 and 64 × 6 learning rates × S seeds, 200 steps per trial (~5–10 s of
training each). N = 12, 24, 48 trials (S = 1, 2, 4).

Figures, from the trials' own timers (`train_s`: seconds inside training steps; `wall_s`: seconds
inside `train_proxy`, which adds model build, corpus load and evaluations) and the sweep's wall W:
- overhead share     = 1 − Σtrain_s / (W × CPUs)   (everything that is not a training step)
- outside-trial share = 1 − Σwall_s / (W × CPUs)   (Ray start, actor start-up + imports, Tune)
- overhead per trial  = (W × CPUs − Σtrain_s) / N  CPU-seconds
- Ray-style overhead  = W / (Σtrain_s / CPUs) − 1, the form of Ray's own scalability benchmark
  (10,000 trials × 1 s on 16 CPUs: 715.27 s observed vs 625 s minimum = 14.4%;
  https://docs.ray.io/en/latest/tune/tutorials/tune-scalability.html).
Growth: least-squares line W = a + b·N over the three sweeps; linear when r² ≈ 1 and the
per-trial slope b stays near the mean trial cost / CPUs.

What-ifs, each to its own results file: `--fresh-actors` (a new process per trial),
`--ascending-widths` (narrowest first), `--resident-ray` (the sweeps join one Ray head started
before them, as on a resident cluster, instead of each starting its own).

The machine is shared: the 1-minute load average before and after each sweep is recorded, and
contention inflates train_s and W alike.

Run: .venv/bin/python benchmarks/sweep_overhead.py      → benchmarks/results/sweep_overhead.json
     (~6 min on 2 idle cores; `--trials 4 --steps 20` for a smoke run)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine_info

CPUS = 2
WIDTHS = [32, 64]
LRS = [1e-3, 2e-3, 3e-3, 5e-3, 7e-3, 1e-2]
RAY_REFERENCE = {
    "trials": 10_000,
    "trial_s": 1.0,
    "cpus": 16,
    "observed_s": 715.27,
    "minimum_s": 625.0,
    "overhead": round(715.27 / 625.0 - 1, 4),
    "source": "https://docs.ray.io/en/latest/tune/tutorials/tune-scalability.html",
}


def sweep_spec(n_trials: int, steps: int):
    from hptransfer.spec import parse_spec

    per_seed = len(WIDTHS) * len(LRS)
    if n_trials % per_seed and n_trials > per_seed:
        raise SystemExit(f"--trials must be a multiple of {per_seed} (widths × lrs) or at most {per_seed}, got {n_trials}")
    seeds = max(1, n_trials // per_seed)
    lrs = LRS if n_trials >= per_seed else LRS[: max(1, n_trials // len(WIDTHS))]
    return parse_spec(
        {
            "name": f"bench-sweep-{n_trials}",
            "model": {"family": "llama", "depth": 2, "head_dim": 16, "seq_len": 64, "parametrization": "mup"},
            "data": {"max_files": 200, "eval_batches": 4},
            "sweep": {
                "widths": WIDTHS,
                "grid": {"lr": lrs},
                "steps": steps,
                "batch_size": 16,
                "seeds": list(range(seeds)),
                "cpus_per_trial": 1,
                "reports": 4,
                "fixed": {"warmup_steps": 10},
            },
            "target": {"width": 256, "steps": 10, "batch_size": 16},
            "ray": {"num_cpus": CPUS, "object_store_mb": 256},
        }
    )


def ray_startup_s() -> dict:
    """Start and stop an empty local Ray the way `run_sweep` does (`StudyContext.ray_session`): the
    fixed cost of every sweep."""
    from hptransfer.context import StudyContext
    from hptransfer.spec import RaySpec

    with tempfile.TemporaryDirectory(prefix="hpt_bench_ray_") as work:
        ctx = StudyContext(None, work, name="bench-ray")
        ctx.ray = RaySpec(num_cpus=CPUS, object_store_mb=256)
        t0 = time.perf_counter()
        with ctx.ray_session():
            t1 = time.perf_counter()
    return {"init_s": round(t1 - t0, 2), "shutdown_s": round(time.perf_counter() - t1, 2)}


_PROBE = r"""
import json, sys, time
t = [time.perf_counter()]
import torch; t.append(time.perf_counter())
import ray.tune; t.append(time.perf_counter())
from hptransfer.sweep.trial import train_proxy; t.append(time.perf_counter())
from hptransfer.data import load_corpus
from hptransfer.models import build_model
from hptransfer.spec import StudySpec
torch.set_num_threads(1)
spec = StudySpec.model_validate(json.loads(sys.argv[1]))
load_corpus(spec.data.val_fraction, spec.data.max_files); t.append(time.perf_counter())
build_model(spec.model, spec.sweep.widths[-1], base_width=spec.base_width, seed=0); t.append(time.perf_counter())
build_model(spec.model, spec.sweep.widths[-1], base_width=spec.base_width, seed=1); t.append(time.perf_counter())
names = ["import_torch", "import_ray_tune", "import_hptransfer_trial", "load_corpus", "first_build_model", "warm_build_model"]
print(json.dumps({n: round(b - a, 3) for n, a, b in zip(names, t, t[1:])}))
"""


def cold_start_probe(steps: int, repeats: int = 2) -> dict:
    """What a fresh trial process pays before its first step (`reuse_actors=False` gives every trial
    a new process, so none of it is cached): imports, corpus read, first model build (which imports
    transformers and mup). Timed in a plain subprocess, best of `repeats`, process start included."""
    import json
    import subprocess

    spec = sweep_spec(12, steps).model_dump_json()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", _PROBE, spec],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "platform")},
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["process_total"] = round(time.perf_counter() - t0, 3)
        runs.append(r)
    best = min(runs, key=lambda r: r["process_total"])
    return {**best, "loadavg_1min": round(os.getloadavg()[0], 2)}


class ProcessCpu:
    """CPU seconds (user + system) of this driver and every process under it, by kind, sampled every
    `every_s` while a sweep runs (a process's last sample counts; one that lived < every_s is missed):
    where the machine's time goes besides the trials' training steps. Kinds: `driver` (this process:
    Tune's loop, the searcher, callbacks), `ray_daemons` (GCS, raylet, agents, log monitor),
    `trial_workers` (Ray worker processes: the trials, their imports and evaluations). Under
    `--resident-ray` the head's processes count too (resident_ray starts it under this driver)."""

    def __init__(self, every_s: float = 0.5):
        import threading

        self.every_s, self.last, self.kind = every_s, {}, {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _kind(p) -> str:
        if p.pid == os.getpid():
            return "driver"
        try:
            cmd = " ".join(p.cmdline())
        except Exception:
            return "other"
        return "trial_workers" if ("default_worker.py" in cmd or "ray::" in cmd) else "ray_daemons"

    def _sample(self) -> None:
        import psutil

        me = psutil.Process()
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                self.last[p.pid] = t.user + t.system
                self.kind.setdefault(p.pid, self._kind(p))
            except Exception:
                pass

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            self._sample()

    def __enter__(self):
        self._sample()
        self.start = dict(self.last)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def totals(self) -> dict:
        out: dict[str, float] = {}
        for pid, cpu in self.last.items():
            k = self.kind[pid]
            out[k] = out.get(k, 0.0) + cpu - self.start.get(pid, 0.0)
        return {k: round(v, 1) for k, v in sorted(out.items())}


def one_sweep(
    n_trials: int,
    steps: int,
    work: Path,
    *,
    order: str = "widest-first",
    reuse_actors: bool = True,
    address: str | None = None,
) -> dict:
    """One `run_sweep` of `n_trials`, timed. `order` and `reuse_actors` are run_sweep's own
    arguments: the what-ifs (ascending widths; a fresh process per trial, which pays the imports,
    corpus read and first model build again) change nothing else. `address`: join that running Ray
    (as `hpt run --address`) instead of starting one per sweep."""
    from hptransfer.study import Study
    from hptransfer.sweep.runner import run_sweep

    study = Study.from_spec(sweep_spec(n_trials, steps), work / f"sweep_{n_trials}", address=address)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    with ProcessCpu() as cpu:
        df, _ = run_sweep(study, restart=True, log=lambda m: None, order=order, reuse_actors=reuse_actors)
    wall = time.perf_counter() - t0
    n = len(df)
    train, inside = float(df["train_s"].sum()), float(df["wall_s"].sum())
    cpu_s = wall * CPUS
    return {
        "trials": n,
        "statuses": df["status"].value_counts().to_dict(),
        "steps_per_trial": steps,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu_s, 1),
        "sum_train_s": round(train, 1),
        "sum_trial_wall_s": round(inside, 1),
        "mean_trial_train_s": round(train / n, 2),
        "mean_trial_wall_s": round(inside / n, 2),
        "overhead_share": round(1 - train / cpu_s, 4),
        "outside_trial_share": round(1 - inside / cpu_s, 4),
        "in_trial_non_step_share": round((inside - train) / cpu_s, 4),
        "overhead_cpu_s_per_trial": round((cpu_s - train) / n, 2),
        "outside_trial_cpu_s_per_trial": round((cpu_s - inside) / n, 2),
        "ray_style_overhead": round(wall / (train / CPUS) - 1, 4),
        "cpu_s_by_process": cpu.totals(),
        "loadavg_1min_before": round(load0, 2),
        "loadavg_1min_after": round(os.getloadavg()[0], 2),
    }


@contextlib.contextmanager
def resident_ray(work: Path):
    """A Ray head started with `ray start` before the timed sweeps and stopped after them, as a
    resident cluster (a KubeRay head, a long-lived `ray start`) would be: the what-if of a sweep
    that does not start and stop its own Ray. Same sizes as a sweep's own local Ray."""
    import socket
    import subprocess

    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray_cli = str(Path(sys.executable).with_name("ray"))
    start = [ray_cli, "start", "--head", "--block", f"--port={port}", f"--num-cpus={CPUS}", "--include-dashboard=false"]
    start += [f"--object-store-memory={256 * 1024 * 1024}", f"--temp-dir={work / 'ray'}", "--disable-usage-stats"]
    # --block keeps `ray start` in the foreground with the head's processes under it, so only this
    # head is stopped below (`ray stop` would stop every Ray of this user on the machine).
    head = subprocess.Popen(start, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 60
        while head.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise SystemExit(f"`ray start --head --port={port}` did not listen within 60 s")
            time.sleep(0.2)
        if head.returncode is not None:
            raise SystemExit(f"`ray start --head` exited with {head.returncode}: {' '.join(start)}")
        yield f"127.0.0.1:{port}"
    finally:
        tree = psutil.Process(head.pid).children(recursive=True) if head.poll() is None else []
        head.terminate()
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            head.kill()
        for proc in tree:  # what the head left behind (a worker mid-exit)
            with contextlib.suppress(psutil.Error):
                proc.kill()


def linear_fit(points: list[tuple[int, float]]) -> dict:
    import numpy as np

    n = np.array([p[0] for p in points], float)
    w = np.array([p[1] for p in points], float)
    b, a = np.polyfit(n, w, 1)
    pred = a + b * n
    r2 = 1 - float(((w - pred) ** 2).sum()) / float(((w - w.mean()) ** 2).sum() or 1)
    return {
        "intercept_s": round(float(a), 2),
        "slope": round(float(b), 3),
        "r2": round(r2, 4),
        "max_rel_residual": round(float(np.max(np.abs(w - pred) / w)), 4),
    }


def summarise(
    info: dict, startup: dict, runs: list[dict], complete: bool, *, order: str = "widest-first", reuse_actors: bool = True
) -> dict:
    ref = next((r for r in runs if r["trials"] == 24), runs[len(runs) // 2])
    fit = linear_fit([(r["trials"], r["wall_s"]) for r in runs]) if len(runs) >= 2 else None
    if fit:
        # The slope a perfectly packed 2-CPU machine would show: mean trial training time / CPUs.
        ideal = sum(r["sum_train_s"] for r in runs) / sum(r["trials"] for r in runs) / CPUS
        fit["ideal_slope_s_per_trial"] = round(ideal, 3)
        fit["slope_over_ideal"] = round(fit["slope"] / ideal, 3)
        # A shared box changes trial speed between sweeps; W against the sweep's ideal time
        # (Σtrain_s / CPUs) separates "grows with the work" from "load changed".
        fit["wall_vs_ideal_fit"] = linear_fit([(r["sum_train_s"] / CPUS, r["wall_s"]) for r in runs])
    goal = marginal_goal(runs) if len(runs) >= 3 else None
    return {
        "benchmark": "sweep_overhead",
        "complete": complete,
        "machine": {**info, "loadavg_at_end": os.getloadavg()},
        "setup": {
            "cpus": CPUS,
            "cpus_per_trial": 1,
            "widths": WIDTHS,
            "lrs": LRS,
            "model": "llama µP depth 2, head_dim 16",
            "seq_len": 64,
            "batch_size": 16,
            "reports_per_trial": 4,
            "reuse_actors": reuse_actors,
            "widest_first": order == "widest-first",
        },
        "ray_startup": startup,
        "headline": {
            k: ref[k]
            for k in (
                "trials",
                "wall_s",
                "overhead_share",
                "outside_trial_share",
                "overhead_cpu_s_per_trial",
                "ray_style_overhead",
                "mean_trial_train_s",
            )
        },
        "runs": runs,
        "growth_fit": fit,
        "ray_reference": RAY_REFERENCE,
        "target": "overhead_share < 0.05 at 5–10 s trials (issue 3)",
        "meets_target": ref["overhead_share"] < 0.05,
        **flat_goal(goal),
    }


def flat_goal(goal: dict | None) -> dict:
    """The goal's figures as top-level scalar fields (`issue39_*`: BENCHMARKS.md's field table)."""
    if not goal:
        return {}
    return {f"issue39_{k}": (f"[{v[0]:g}, {v[1]:g}]" if isinstance(v, list) else v) for k, v in goal.items()}


GOAL_MARGINAL = 0.05  # issue 39: marginal overhead per trial <= 5% of its step time, trials of >= 5 s
GOAL_TRIAL_S = 5.0


def marginal_goal(runs: list[dict]) -> dict:
    """Issue 39's goal, from the sweeps' own W = a + b·N: the marginal cost of one more trial is b
    CPU-seconds ×CPUS; its overhead is b·CPUS / mean train_s − 1 (0: each trial adds only its training
    steps), with a 95% interval from the slope's OLS standard error (Student t, n − 2 dof); the fixed
    cost a (Ray start, first trial processes) reported beside it. Verdict from the interval: met when
    its upper end is ≤ 5%, not met when its lower end is above, else inconclusive."""
    import numpy as np
    from scipy.stats import t as student

    n = np.array([r["trials"] for r in runs], float)
    w = np.array([r["wall_s"] for r in runs], float)
    b, a = np.polyfit(n, w, 1)
    dof = len(n) - 2
    s2 = float(((w - (a + b * n)) ** 2).sum()) / dof
    sxx = float(((n - n.mean()) ** 2).sum())
    se_b, se_a = (s2 / sxx) ** 0.5, (s2 * (1 / len(n) + n.mean() ** 2 / sxx)) ** 0.5
    q = float(student.ppf(0.975, dof))
    train = sum(r["sum_train_s"] for r in runs) / sum(r["trials"] for r in runs)
    m = b * CPUS / train - 1
    lo, hi = (b - q * se_b) * CPUS / train - 1, (b + q * se_b) * CPUS / train - 1
    long_enough = train >= GOAL_TRIAL_S
    verdict = ("met" if hi <= GOAL_MARGINAL else "not met" if lo > GOAL_MARGINAL else "inconclusive (the interval spans 5%)") + (
        "" if long_enough else f" (trials of {train:.2g} s: shorter than the goal's {GOAL_TRIAL_S:g} s)"
    )
    return {
        "goal": f"marginal overhead per trial <= {GOAL_MARGINAL:.0%} of its step time at trials of >= {GOAL_TRIAL_S:g} s, "
        "resident Ray, fixed cost beside it (issue 39)",
        "mean_trial_train_s": round(train, 2),
        "marginal_overhead": round(m, 4),
        "marginal_overhead_ci95": [round(lo, 4), round(hi, 4)],
        "marginal_cpu_s_per_trial": round(b * CPUS - train, 3),
        "fixed_cost_s": round(float(a), 1),
        "fixed_cost_ci95_s": [round(float(a - q * se_a), 1), round(float(a + q * se_a), 1)],
        "sweeps": len(runs),
        "verdict": verdict,
    }


_WORKER_PROBE = r"""
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR")
print(ray.get(ray.remote(lambda: __import__("hptransfer").__file__).remote()))
ray.shutdown()
"""


def tree_of(module_file: str) -> str:
    """Which tree a process imported hptransfer from, without this machine's paths: the working
    tree, or before_after's extracted `git archive` of the ref (a temporary folder)."""
    tree = Path(module_file).resolve().parents[2]  # <tree>/platform/hptransfer/__init__.py
    return "working tree" if tree == ROOT.resolve() else "git archive of the ref"


def before_after(ref: str, sizes: list[int], steps: int, out: str, info: dict, after_first: bool = False) -> dict:
    """The same sweeps with the product at git `ref` (before) and at the working tree (after), in one
    run, alternating (before, after) per size so both see the same load; each sweep in a fresh
    process whose PYTHONPATH puts that tree's `platform/` first (its Ray workers inherit it)."""
    import subprocess

    from hptransfer.io import write_json

    trees = {"after": ROOT}
    work = Path(tempfile.mkdtemp(prefix="hpt_bench_before_"))
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "platform"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
        trees["before"] = work
        env = {tag: {**os.environ, "PYTHONPATH": str(tree / "platform")} for tag, tree in trees.items()}
        probe = subprocess.run([sys.executable, "-c", _WORKER_PROBE], capture_output=True, text=True, env=env["before"])
        workers_import = tree_of(probe.stdout.strip().splitlines()[-1]) if probe.stdout.strip() else probe.stderr[-300:]
        pairs = []
        for n in sizes:
            pair = {"trials_grid": n}
            for tag in ("after", "before") if after_first else ("before", "after"):
                path = work / f"{tag}_{n}.json"
                subprocess.run(
                    [sys.executable, __file__, "--single", "--trials", str(n), "--steps", str(steps), "--out", str(path)],
                    check=True,
                    env=env[tag],
                    cwd=str(ROOT / "benchmarks"),
                )
                pair[tag] = json.loads(path.read_text())
            b, a = pair["before"], pair["after"]
            pair["after_over_before"] = {
                k: round(a[k] / b[k], 3) for k in ("wall_s", "sum_trial_wall_s", "sum_train_s") if b.get(k)
            }
            pair["overhead_share_change"] = round(a["overhead_share"] - b["overhead_share"], 4)
            pairs.append(pair)
            result = {
                "benchmark": "sweep_overhead_before_after",
                "ref_before": ref,
                "after": "working tree",
                "order": "after, before" if after_first else "before, after",
                "machine": {**info, "loadavg_at_end": os.getloadavg()},
                "before_workers_import_hptransfer_from": workers_import,
                "pairs": pairs,
            }
            write_json(out, result)
            print(f"[sweep_overhead] {json.dumps(pair)}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", default="12,24,48", help="comma-separated sweep sizes (multiples of 12)")
    ap.add_argument("--steps", type=int, default=200, help="training steps per trial")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sweep_overhead.json"))
    ap.add_argument(
        "--fresh-actors",
        action="store_true",
        help="what-if: run the same sweeps with run_sweep(..., reuse_actors=False), a fresh process per trial; "
        "write to results/sweep_overhead_fresh_actors.json",
    )
    ap.add_argument(
        "--ascending-widths",
        action="store_true",
        help="what-if: start the narrowest trials first, run_sweep(..., order='ascending'); "
        "write to results/sweep_overhead_ascending_widths.json",
    )
    ap.add_argument(
        "--resident-ray",
        action="store_true",
        help="what-if: every sweep joins one Ray head started (`ray start`) before them and stopped after, "
        "as on a resident cluster, instead of starting its own; write to results/sweep_overhead_resident_ray.json",
    )
    ap.add_argument(
        "--probe-only", action="store_true", help="only time a fresh trial process's start-up and merge it into an existing --out"
    )
    ap.add_argument(
        "--before",
        metavar="REF",
        help="before/after in one run: each --trials size swept with the product at git REF, then with the working "
        "tree, alternating; writes the pairs to --out (default results/sweep_overhead_before_after.json)",
    )
    ap.add_argument(
        "--after-first", action="store_true", help="with --before: sweep the working tree first (a second pair, ABBA)"
    )
    ap.add_argument("--single", action="store_true", help=argparse.SUPPRESS)  # one sweep → --out (for --before)
    args = ap.parse_args(argv)

    from hptransfer.env import configure
    from hptransfer.io import write_json

    configure()
    order, reuse_actors = ("ascending" if args.ascending_widths else "widest-first"), not args.fresh_actors
    if args.fresh_actors and args.out == ap.get_default("out"):
        args.out = str(ROOT / "benchmarks" / "results" / "sweep_overhead_fresh_actors.json")
    if args.ascending_widths and args.out == ap.get_default("out"):
        args.out = str(ROOT / "benchmarks" / "results" / "sweep_overhead_ascending_widths.json")
    if args.resident_ray and args.out == ap.get_default("out"):
        args.out = str(ROOT / "benchmarks" / "results" / "sweep_overhead_resident_ray.json")
    sizes = [int(x) for x in args.trials.split(",")]
    info = machine_info([str(Path(__file__).relative_to(ROOT)), *argv])
    if args.single:
        import hptransfer

        work = Path(tempfile.mkdtemp(prefix="hpt_bench_sweep_"))
        try:
            run = {**one_sweep(sizes[0], args.steps, work), "hptransfer_from": tree_of(hptransfer.__file__)}
        finally:
            shutil.rmtree(work, ignore_errors=True)
        write_json(args.out, run)
        return run
    if args.before:
        if args.out == ap.get_default("out"):
            args.out = str(ROOT / "benchmarks" / "results" / "sweep_overhead_before_after.json")
        return before_after(args.before, sizes, args.steps, args.out, info, after_first=args.after_first)
    if args.probe_only:
        result = json.loads(Path(args.out).read_text())
        result["cold_start_probe"] = {**cold_start_probe(args.steps), "command": info["command"], "date_utc": info["date_utc"]}
        write_json(args.out, result)
        return result
    probe = cold_start_probe(args.steps)
    work = Path(tempfile.mkdtemp(prefix="hpt_bench_sweep_"))
    try:
        startup = ray_startup_s()
        runs: list[dict] = []
        with resident_ray(work) if args.resident_ray else contextlib.nullcontext() as address:
            for n in sizes:
                runs.append(one_sweep(n, args.steps, work, order=order, reuse_actors=reuse_actors, address=address))
                print(f"[sweep_overhead] {runs[-1]}", flush=True)
                # Written after every sweep size, so a run cut short still leaves its figures.
                done = len(runs) == len(sizes)
                result = summarise(info, startup, runs, done, order=order, reuse_actors=reuse_actors)
                result = {**result, "resident_ray": bool(address), "cold_start_probe": probe}
                write_json(args.out, result)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"[sweep_overhead] wrote {args.out}", flush=True)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
