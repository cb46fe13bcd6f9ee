"""The study spec: one YAML file describes the ladder, the grid, the rule and the target.

Validated once, at load, by pydantic; every error is reported at once with its YAML path, the bad
value and what is allowed (`hpt validate SPEC`). Defaults live on the fields, nowhere else.

One module per section of the spec: `base` (the strict base model, bounds, the rules by name),
`model`, `data`, `sweep` (with `coord_check`), `target` (with `transfer`), `train` (with `tracking`
and `ray`), `dp`, and `study` (the whole spec, parse/load and the hashes). Import from here.
"""

from hptransfer.errors import SpecError
from hptransfer.hyperparameters import DEFAULT_HPS, LOG_SCALE, TUNABLE, Hyperparameters
from hptransfer.spec.base import (
    BYTE_VOCAB,
    DEFAULT_PRECISION,
    MAX_SEED,
    MAX_STEPS,
    MAX_WIDTH,
    RULE_NAMES,
    RULE_TRAINING,
    Precision,
    RuleTraining,
    WeightDecayScaling,
    rule_training,
)
from hptransfer.spec.data import DataSpec
from hptransfer.spec.dp import DPSweepSpec, StudyDPConfig
from hptransfer.spec.model import ModelSpec
from hptransfer.spec.study import (
    PACKAGE_DEFAULTS_HINT,
    StudySpec,
    load_spec,
    package_defaults_sweep_hash,
    parse_spec,
    spec_hash,
    sweep_hash,
)
from hptransfer.spec.sweep import AxesSpec, CoordCheckSpec, OptunaSpec, SweepSpec
from hptransfer.spec.target import TargetSpec, TransferSpec
from hptransfer.spec.train import RaySpec, TrackingSpec, TrainSpec

__all__ = [
    "BYTE_VOCAB",
    "DEFAULT_HPS",
    "DEFAULT_PRECISION",
    "LOG_SCALE",
    "MAX_SEED",
    "MAX_STEPS",
    "MAX_WIDTH",
    "PACKAGE_DEFAULTS_HINT",
    "RULE_NAMES",
    "RULE_TRAINING",
    "TUNABLE",
    "AxesSpec",
    "CoordCheckSpec",
    "DPSweepSpec",
    "DataSpec",
    "Hyperparameters",
    "ModelSpec",
    "OptunaSpec",
    "Precision",
    "RaySpec",
    "RuleTraining",
    "SpecError",
    "StudyDPConfig",
    "StudySpec",
    "SweepSpec",
    "TargetSpec",
    "TrackingSpec",
    "TrainSpec",
    "TransferSpec",
    "WeightDecayScaling",
    "load_spec",
    "package_defaults_sweep_hash",
    "parse_spec",
    "rule_training",
    "spec_hash",
    "sweep_hash",
]
