"""Process-wide settings for side files and offline use, applied once at the edges (CLI, pipeline).

Set only where the user has not: a user's own RAY_TMPDIR or TORCH_EXTENSIONS_DIR wins.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def configure() -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # DeepSpeed's JIT-built ops embed absolute venv paths: one cache per environment.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    # ...and are built by the `ninja` first on PATH. Put the one installed beside this interpreter
    # (a dependency) first, so every process and scripts/setup.sh's prebuild use the same one: two
    # ninja versions read each other's build log as stale and rebuild the op (~30 s, every switch).
    bindir = str(Path(sys.executable).parent)
    if (Path(bindir) / "ninja").exists() and bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    os.environ.setdefault("MPLCONFIGDIR", str(Path(sys.prefix) / "mplconfig"))
    # Tune otherwise changes each trial's working directory and adds noisy warnings.
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # MLflow's own stderr handler would print its INFO lines; without it they reach the root logger,
    # which hptransfer.logs sends to the study's log file.
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
