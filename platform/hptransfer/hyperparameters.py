"""The tunable hyperparameters, typed: one field each, with its default, its search scale and where
it is applied. Every stage (sweep trials, coordinate check, large run, DP path, exports) reads the
same `Hyperparameters`, so a tunable that reaches no model cannot exist: `applied` names the code
that consumes it (`hptransfer.models.setup.training_setup`), and a test changes each one and checks
that the trained weights change.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Scale = Literal["log", "linear"]
Applied = Literal["optimizer", "init", "readout", "schedule", "clipping"]


def _hp(default: float, scale: Scale, applied: Applied, description: str, **bounds: float) -> Any:
    return Field(default, description=description, json_schema_extra={"scale": scale, "applied": applied}, **bounds)


class Hyperparameters(BaseModel):
    """What one training run is given. Under µP the values are base-width values (µP's per-layer
    multipliers carry them to any width)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    lr: float = _hp(
        1e-2, "log", "optimizer", "Peak learning rate of AdamW (µP: MuAdamW, hidden matrices get lr/width_mult).", gt=0
    )
    weight_decay: float = _hp(
        0.0,
        "log",
        "optimizer",
        "AdamW weight decay on matrices (not norms or biases); µP scales it ×width_mult on hidden matrices.",
        ge=0,
    )
    warmup_steps: float = _hp(0.0, "linear", "schedule", "Linear warmup steps before the cosine decay to 10% of the peak.", ge=0)
    beta1: float = _hp(0.9, "linear", "optimizer", "Adam β1.", ge=0, lt=1)
    beta2: float = _hp(0.98, "linear", "optimizer", "Adam β2.", ge=0, lt=1)
    init_std: float = _hp(
        0.02,
        "log",
        "init",
        "Init std of embeddings and (at the base width) hidden matrices; hidden ones scale ∝ 1/√fan_in.",
        gt=0,
    )
    output_mult: float = _hp(
        1.0,
        "log",
        "readout",
        "Multiplier on the readout's input (µP: MuReadout's output_mult, divided by width_mult; SP: as is).",
        gt=0,
    )
    grad_clip: float = _hp(
        0.0,
        "linear",
        "clipping",
        "Global gradient-norm clipping bound; 0 = off. The large run clips exactly as the sweep did.",
        ge=0,
    )

    @classmethod
    def of(cls, *layers: dict[str, Any] | None) -> Hyperparameters:
        """Defaults, overlaid by each mapping in turn (e.g. the sweep's fixed values, then a trial's)."""
        merged: dict[str, Any] = {}
        for layer in layers:
            merged.update(layer or {})
        return cls.model_validate(merged)

    def as_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.model_dump().items()}


def _meta(name: str, key: str) -> str:
    return Hyperparameters.model_fields[name].json_schema_extra[key]  # type: ignore[index]


TUNABLE: frozenset[str] = frozenset(Hyperparameters.model_fields)
# Fitted against log(value): the optimum of these moves multiplicatively.
LOG_SCALE: frozenset[str] = frozenset(n for n in TUNABLE if _meta(n, "scale") == "log")
APPLIED: dict[str, str] = {n: _meta(n, "applied") for n in Hyperparameters.model_fields}
DEFAULT_HPS: dict[str, float] = Hyperparameters().as_dict()
