"""The README's test command, timed as CI runs it: each pytest tier (`-m "not slow"`, then `-m slow`)
on the 2 pytest-xdist workers `.ci/run` uses, in the repository as it is, with the machine's load
sampled every 30 s (these 2-core machines are shared and noisy: a wall time without the load beside
it says little). Writes benchmarks/results/ci_tiers.json: per tier the wall time, pytest's summary
line, the load samples and the slowest test phases; `--workers 0` times the tiers without xdist.

CI's budget is 20 minutes for all of `.ci/run` (setup with uv, ruff, both tiers). `--fresh-clone`
does what CI does: clones HEAD into a temporary folder, times its `CI=true bash scripts/setup.sh`
(a new .venv; uv's download cache is kept, as a CI runner's may be) and runs the tiers there, with
that venv and this shell's environment (here PYTHONDONTWRITEBYTECODE=1, as on the CI machines). A
run in this checkout instead reuses its venv and caches, which a fresh clone does not have: stop
31's CI took 1730 s where this checkout's run projected 874 s, chiefly because a fresh venv had no
.pyc files and nothing was allowed to write them (scripts/setup.sh now compiles them). Without
`--fresh-clone`, `--setup-s` adds a setup time measured apart.

Run: .venv/bin/python benchmarks/ci_tiers.py [--fresh-clone] [--tiers "not slow" slow] [--workers 2] [--setup-s S]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import RESULTS, ROOT, machine_info


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def fresh_clone() -> tuple[Path, float]:
    """HEAD cloned into a temporary folder and set up as CI sets it up; (folder, setup seconds)."""
    # Beside this checkout, so ../shared (the schemas the manifest tests validate against) is there too.
    where = Path(tempfile.mkdtemp(prefix="ci_tiers_", dir=ROOT.parent))
    subprocess.run(["git", "clone", "-q", str(ROOT), str(where)], check=True)
    t0 = time.perf_counter()
    r = subprocess.run(["bash", "scripts/setup.sh"], cwd=where, env={**os.environ, "CI": "true"}, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"setup failed in the fresh clone {where}:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return where, time.perf_counter() - t0


def run_tier(marker: str, workers: int, timeout_s: float, root: Path = ROOT, python: str = sys.executable) -> dict:
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker, "--durations=15"]
    if workers:
        cmd[4:4] = ["-n", str(workers), "--dist", "loadfile"]
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(30):
            samples.append(round(os.getloadavg()[0], 2))

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    done.set()
    lines = r.stdout.splitlines()
    summary = next((ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed)", ln)), None)
    slowest = [
        {"s": float(m.group(1)), "phase": m.group(2), "test": m.group(3)}
        for m in (re.match(r"^([\d.]+)s (call|setup|teardown)\s+(\S+)", ln) for ln in lines)
        if m
    ]
    failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in lines if ln.startswith("FAILED ")]
    return {
        "marker": marker,
        "command": " ".join(["python", *cmd[1:]]),
        "returncode": r.returncode,
        "wall_s": round(wall, 1),
        "summary": summary,
        "failed": failed,
        "loadavg_1min_every_30s": {
            "n": len(samples),
            "min": min(samples, default=None),
            "median": statistics.median(samples) if samples else None,
            "max": max(samples, default=None),
        },
        "slowest": slowest,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiers", nargs="+", default=["not slow", "slow"], help="pytest -m expressions, run in order")
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (0: no xdist)")
    ap.add_argument("--setup-s", type=float, default=None, help="a fresh clone's `bash scripts/setup.sh`, measured apart")
    ap.add_argument("--timeout-s", type=float, default=3600, help="per tier")
    ap.add_argument("--fresh-clone", action="store_true", help="clone HEAD, time its setup and run the tiers there (as CI)")
    ap.add_argument("--keep", action="store_true", help="with --fresh-clone: keep the clone (default: removed)")
    ap.add_argument("--out", default=str(RESULTS / "ci_tiers.json"))
    a = ap.parse_args(argv)
    root, python = ROOT, sys.executable
    if a.fresh_clone:
        print("[ci_tiers] cloning HEAD and running CI=true bash scripts/setup.sh there …", flush=True)
        root, setup_s = fresh_clone()
        python, a.setup_s = str(root / ".venv" / "bin" / "python"), round(setup_s, 1)
        print(f"[ci_tiers] set up in {setup_s:.0f} s in {root}", flush=True)
    tiers = []
    for marker in a.tiers:
        print(f"[ci_tiers] pytest -m {marker!r} on {a.workers or 'no'} xdist workers …", flush=True)
        tiers.append(run_tier(marker, a.workers, a.timeout_s, root, python))
        print(f"[ci_tiers] {tiers[-1]['summary']} in {tiers[-1]['wall_s']:.0f} s", flush=True)
    total = sum(t["wall_s"] for t in tiers) + (a.setup_s or 0)
    out = {
        "benchmark": "ci_tiers",
        "what": "the README's test command as .ci/run runs it (both tiers, pytest-xdist), on this machine as it was"
        + (", in a fresh clone set up as CI sets it up" if a.fresh_clone else ", in this checkout (its venv and caches)"),
        "fresh_clone": a.fresh_clone,
        "env": {k: os.environ.get(k) for k in ("PYTHONDONTWRITEBYTECODE", "CI")},
        "commit": _git("rev-parse", "--short", "HEAD"),
        "tree_clean": _git("status", "--porcelain", "--untracked-files=no") == "",
        "machine": machine_info(argv if argv is not None else sys.argv[1:]),
        "workers": a.workers,
        "setup_s": a.setup_s,
        "tiers": tiers,
        "tests_plus_setup_s": round(total, 1),
        "budget_s": 1200,
        "verdict": ("within the 20-minute CI budget" if total <= 1200 else "over the 20-minute CI budget")
        + " on this run (ruff's seconds not counted); the load beside each tier says how far it transfers to an idle CI machine",
    }
    tmp = f"{a.out}.tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, a.out)
    if a.fresh_clone and not a.keep:
        shutil.rmtree(root, ignore_errors=True)
    print(f"[ci_tiers] {out['verdict']}: {total:.0f} s → {a.out}")
    return 0 if all(t["returncode"] in (0, 5) for t in tiers) else 1


if __name__ == "__main__":
    sys.exit(main())
