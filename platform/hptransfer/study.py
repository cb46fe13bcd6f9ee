"""`from hptransfer.study import Study` keeps working: the notebook facade lives in
`hptransfer.pipeline` (with the stage functions it calls), the study folder's names in
`hptransfer.layout`, the context every stage takes in `hptransfer.context`. Nothing in the package
imports this module; it is for users, tests and benchmarks.
"""

from hptransfer.context import StudyContext
from hptransfer.layout import (
    DP_SWEEP_EXPERIMENT,
    STUDIES_ROOT,
    SWEEP_EXPERIMENT,
    TRAIN_EXPERIMENT,
    StudyPaths,
    TrainPaths,
    default_tracking_uri,
    resolve_tracking_uri,
)
from hptransfer.pipeline import Study

__all__ = [
    "DP_SWEEP_EXPERIMENT",
    "STUDIES_ROOT",
    "SWEEP_EXPERIMENT",
    "TRAIN_EXPERIMENT",
    "Study",
    "StudyContext",
    "StudyPaths",
    "TrainPaths",
    "default_tracking_uri",
    "resolve_tracking_uri",
]
