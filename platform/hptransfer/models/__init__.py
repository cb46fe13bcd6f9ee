"""Model families at any width, under SP or µP. `build_model` is the one entry point."""

from hptransfer.models.build import build_model, lm_logits, param_count
from hptransfer.models.optim import build_optimizer, lr_schedule

__all__ = ["build_model", "build_optimizer", "lm_logits", "lr_schedule", "param_count"]
