"""What the benchmarks share (scripts in this folder import it as `common`): the machine a result
ran on, intervals over seeds and the verdicts read from them, and the run cache that lets a killed
benchmark resume and another benchmark reuse its runs."""

from __future__ import annotations

import datetime as dt
import json
import math
import multiprocessing as mp
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def machine_info(argv: list[str] | None = None, **extra) -> dict:
    """CPU, versions, date, the command that reproduces the figures and the load when it started."""
    import deepspeed
    import ray
    import torch

    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")),
        platform.processor() or platform.machine(),
    )
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "deepspeed": deepspeed.__version__,
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *(argv if argv is not None else sys.argv)]),
        "loadavg_at_start": os.getloadavg(),
        **extra,
    }


# --- intervals and verdicts (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """A mean over seeds with its 95% t-interval. Fewer than 2 values have no interval: the bounds
    are then −inf and +inf (a t-interval with 0 degrees of freedom is unbounded)."""

    mean: float
    lo: float
    hi: float
    n: int

    def as_dict(self) -> dict:
        """{"mean", "lo", "hi", "n"}, the bounds null when there is no interval (JSON has no inf)."""
        bounded = self.n >= 2
        return {"mean": self.mean, "lo": self.lo if bounded else None, "hi": self.hi if bounded else None, "n": self.n}


def t_interval(xs: Iterable[float]) -> Interval:
    """Mean of `xs` and its 95% t-interval: mean ± t(0.975, n − 1) · sd / √n, sd with n − 1 dof."""
    import numpy as np
    from scipy.stats import t as student

    a = np.asarray(list(xs), float)
    m = float(a.mean())
    if len(a) < 2:
        return Interval(m, -math.inf, math.inf, len(a))
    half = float(student.ppf(0.975, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))
    return Interval(m, m - half, m + half, len(a))


def verdict(lo: float | None, hi: float | None, *, inside: tuple[float, float] | None = None, below: float | None = None) -> str:
    """reproduced when the whole interval satisfies the claim, not reproduced when none of it does,
    inconclusive otherwise (the noise is larger than the effect, or there is no interval)."""
    if lo is None or hi is None:
        return "inconclusive"
    if inside is not None:
        a, b = inside
        if a <= lo and hi <= b:
            return "reproduced"
        return "not reproduced" if hi < a or lo > b else "inconclusive"
    if hi < below:
        return "reproduced"
    return "not reproduced" if lo >= below else "inconclusive"


# --- the run cache ----------------------------------------------------------------------------------


def key_str(key: dict) -> str:
    """A run's settings as the cache's key (field order does not matter)."""
    return json.dumps(key, sort_keys=True)


class RunCache:
    """Finished benchmark runs in a JSON-lines file, one line per run: its settings (the key: every
    field that changes its result) and its figures. A line is appended and flushed as each run
    finishes, so a killed benchmark resumes where it stopped, and a benchmark with the same settings
    (paper_claims.py and transfer_regret.py) reuses the other's runs instead of training them again."""

    def __init__(self, path: str | Path, *, train: bool = True):
        self.path = Path(path)
        self.train = train  # False: every run must come from the file (re-plan only)
        self.trained = 0  # runs trained by this process; the rest came from the file

    def load(self, fields: Iterable[str]) -> dict[str, dict]:
        """Every run in the file by its key over `fields`; a line cut short by a killed run is
        skipped (that run is trained again), and a later line for the same key wins."""
        fields = list(fields)
        out: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out[key_str({k: r.get(k) for k in fields})] = r
        return out

    def _ends_mid_line(self) -> bool:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return False
        with self.path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"

    def run(
        self,
        keys: list[dict],
        train: Callable[[dict], dict],
        *,
        procs: int,
        first: Callable[[dict], Any] | None = None,
        describe: Callable[[dict], str] = key_str,
        initializer: Callable | None = None,
        initargs: tuple = (),
        pool=None,
    ) -> dict[str, dict]:
        """The results of `keys`, by `key_str`: cached ones read from the file, the others trained by
        `train(key) -> {**key, figures}` in `procs` spawned processes, ordered by `first` (e.g. the
        longest runs first, so no core idles at the end), each written to the file as it finishes.
        `pool`: a process pool to reuse instead (a benchmark that trains in many small rounds: each new
        pool costs tens of seconds of imports and corpus reading on a busy machine)."""
        if not keys:
            return {}
        fields = list(keys[0])
        done = self.load(fields)
        unique = {key_str(k): k for k in keys}
        todo = [k for s, k in unique.items() if s not in done]
        if first is not None:
            todo.sort(key=first)
        print(f"{len(keys)} runs, {len(todo)} to train ({len(unique) - len(todo)} cached in {self.path})", flush=True)
        if todo and not self.train:
            raise SystemExit(
                f"{len(todo)} of {len(keys)} runs are not in the run cache {self.path}, and this invocation may not train "
                f"(--cached-only); first missing: {key_str(todo[0])}. Drop --cached-only to train them, or point the "
                "benchmark at the cache that holds them."
            )
        self.trained += len(todo)
        if todo:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            cut = self._ends_mid_line()
            own = pool is None
            pool = mp.get_context("spawn").Pool(procs, initializer, initargs) if own else pool
            try:
                with self.path.open("a") as f:
                    if cut:  # the line a kill cut short stays unreadable; the next run starts a line of its own
                        f.write("\n")
                    for i, r in enumerate(pool.imap_unordered(train, todo), 1):
                        f.write(json.dumps(r) + "\n")
                        f.flush()
                        done[key_str({k: r[k] for k in fields})] = r
                        print(f"[{i}/{len(todo)} {time.perf_counter() - t0:6.0f}s] {describe(r)}", flush=True)
            finally:
                if own:  # as `with Pool(...)` does
                    pool.terminate()
        return {key_str(k): done[key_str(k)] for k in keys}
