"""What every benchmark records about where it ran (scripts in this folder import it as `common`)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
from pathlib import Path

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
