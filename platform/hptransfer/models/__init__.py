"""Model families at any width, under SP or µP; `training_setup` applies a `Hyperparameters`."""

from hptransfer.models.build import build_model, evaluate, lm_logits, param_count
from hptransfer.models.optim import build_optimizer, lr_schedule
from hptransfer.models.setup import TrainingSetup, training_setup

__all__ = [
    "TrainingSetup",
    "build_model",
    "build_optimizer",
    "evaluate",
    "lm_logits",
    "lr_schedule",
    "param_count",
    "training_setup",
]
