"""`Study`, the notebook facade: a `StudyContext` (hptransfer/context.py) with one method per stage
of `hptransfer.pipeline`.

    study = Study.from_spec("search_spaces/quickstart.yaml")
    study.coord_check(); df = study.sweep(); plan = study.transfer(); metrics = study.train(); study.report()
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hptransfer.context import StudyContext
from hptransfer.layout import (  # noqa: F401  (re-exported: the names callers used to import from here)
    DP_SWEEP_EXPERIMENT,
    NOISE_EXPERIMENT,
    STUDIES_ROOT,
    SWEEP_EXPERIMENT,
    TRAIN_EXPERIMENT,
    StudyPaths,
    TrainPaths,
    default_tracking_uri,
    resolve_tracking_uri,
)

if TYPE_CHECKING:
    import pandas as pd


class Study(StudyContext):
    """A study with its stages as methods (each returns its artifact)."""

    # --- the stages, for notebooks (each returns its artifact) -----------------------------------

    def coord_check(self, widths: list[int] | None = None):
        from hptransfer import pipeline

        return pipeline.coord_check_stage(self, widths=widths)

    def sweep(self, *, restart: bool = False) -> pd.DataFrame:
        from hptransfer import pipeline

        return pipeline.sweep_stage(self, restart=restart).table

    def transfer(self):
        from hptransfer import pipeline

        return pipeline.transfer_stage(self)

    def train(self, plan=None, **knobs: Any) -> dict:
        from hptransfer import pipeline

        return pipeline.train_stage(self, plan, **knobs)

    def report(self) -> Path:
        from hptransfer import pipeline

        return pipeline.report_stage(self)

    def run(self, **kw: Any) -> dict:
        from hptransfer import pipeline

        return pipeline.run_study(self, **kw)
