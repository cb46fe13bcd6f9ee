"""What a new study's MLflow SQLite store costs: made by MLflow (tables, then ~50 schema migrations)
against seeded from the cached empty store (`hptransfer.tracking.seed_sqlite_store`), in pairs.

Run: .venv/bin/python benchmarks/mlflow_store.py [--pairs 6] → results/mlflow_store.json

Each pair opens two new stores in one process (MLflow already imported, as in `hpt run` when its
sweep logs its first run), in alternating order so a change in the machine's load falls on both:
`MlflowClient(uri).search_experiments()` on a new file, and the same after `seed_sqlite_store(uri)`.
The cache itself is made before the pairs (once per MLflow version and environment; its cost,
`cache_build_s`, is one native store plus a copy). Figures: each variant's mean seconds with a 95%
t-interval, and the per-pair difference native − seeded with its interval; verdict "reproduced"
when the whole interval of the difference is above 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine_info, t_interval, verdict


def _open(uri: str) -> None:
    from mlflow import MlflowClient

    MlflowClient(uri).search_experiments()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--out", type=Path, default=RESULTS / "mlflow_store.json")
    args = ap.parse_args(argv)

    import logging

    import mlflow

    from hptransfer.io import write_json
    from hptransfer.tracking import STORE_CACHE, _empty_store, seed_sqlite_store

    logging.getLogger("alembic").setLevel(logging.WARNING)
    machine = machine_info(argv if argv is not None else sys.argv)
    cached = (STORE_CACHE / f"mlflow-{mlflow.__version__}-empty.db").is_file()
    t = time.perf_counter()
    _empty_store()
    cache_build_s = None if cached else time.perf_counter() - t
    native, seeded = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for kind in ("native", "seeded") if i % 2 == 0 else ("seeded", "native"):
                uri = f"sqlite:///{tmp}/{kind}-{i}.db"
                t = time.perf_counter()
                if kind == "seeded":
                    assert seed_sqlite_store(uri)
                _open(uri)
                (seeded if kind == "seeded" else native).append(time.perf_counter() - t)
                print(f"pair {i + 1}/{args.pairs} {kind}: {(seeded if kind == 'seeded' else native)[-1]:.2f} s", flush=True)
    diff = t_interval(n - s for n, s in zip(native, seeded))
    result = {
        "benchmark": "mlflow_store",
        "machine": {**machine, "loadavg_end": os.getloadavg(), "mlflow": mlflow.__version__},
        "setup": {"pairs": args.pairs, "order": "alternating", "what": "MlflowClient(new sqlite file).search_experiments()"},
        "native_s": [round(x, 3) for x in native],
        "seeded_s": [round(x, 3) for x in seeded],
        "native": t_interval(native).as_dict(),
        "seeded": t_interval(seeded).as_dict(),
        "native_minus_seeded": diff.as_dict(),
        "ratio_of_means": sum(native) / sum(seeded),
        "cache_build_s": cache_build_s,
        "claim": "a seeded store opens faster than one MLflow makes (native − seeded > 0)",
        # the interval of seeded − native, read against "below 0"
        "verdict": verdict(-diff.hi if diff.n >= 2 else None, -diff.lo if diff.n >= 2 else None, below=0.0),
    }
    write_json(args.out, result)
    print(json.dumps({k: result[k] for k in ("native", "seeded", "native_minus_seeded", "ratio_of_means", "verdict")}, indent=1))


if __name__ == "__main__":
    main()
