"""`sweep:` and `coord_check:`: the width ladder, its grid or Optuna box, the axes arms beyond width,
and the coordinate check run before it."""

from __future__ import annotations

import itertools
import math
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from hptransfer.hyperparameters import LOG_SCALE, TUNABLE
from hptransfer.spec.base import MAX_SEED, MAX_STEPS, MAX_WIDTH, Precision, _check_hps, _Strict


class AxesSpec(_Strict):
    """Arms of the sweep beyond the width ladder (issue 23): each value of `steps` or `batch_size`
    runs the LR grid and the replicate seeds at one width, the other axes at the ladder's."""

    width: int | None = Field(
        None,
        ge=1,
        le=MAX_WIDTH,
        description="The width the arms run at; one of sweep.widths. Default: the middle of the ladder (the lower "
        "middle for an even count): wider than the narrowest, whose optima are the noisiest, and cheaper than the widest.",
    )
    bracket: int = Field(
        2,
        ge=0,
        le=8,
        description="An arm whose best lr (seed-averaged) is the lowest or highest it tried runs one more lr a grid step "
        "beyond it, with the grid's seeds, up to this many times, so each arm's optimum is bracketed before its "
        "replicates run (an edge optimum is a bound, and a law fitted on bounds is the prior in practice); 0: the grid only.",
    )
    steps: list[int] = Field(
        default_factory=list,
        description="Training horizons (steps per trial) swept besides sweep.steps, e.g. [50, 200, 400]: the law of the "
        "optimal LR against the horizon (transfer/axes.py).",
    )
    batch_size: list[int] = Field(
        default_factory=list,
        description="Batch sizes (sequences) swept besides sweep.batch_size, e.g. [8, 32, 64]: the law of the optimal LR "
        "against the batch.",
    )
    depth: list[int] = Field(
        default_factory=list,
        description="Depths (blocks) swept besides model.depth, e.g. [4, 8]: the law of the optimal LR against depth, "
        "flat by construction under model.depth_parametrization: completep (hptransfer.models.depth).",
    )
    noise_scale_batches: int = Field(
        4,
        ge=0,
        le=64,
        description="Batches each trial spends at its end measuring the gradient noise scale B_simple = tr(Σ)/|G|² "
        "(the critical batch; the plan warns when the target's batch is beyond it); 0: not measured.",
    )

    @field_validator("steps", "batch_size", "depth")
    @classmethod
    def _values(cls, v: list[int], info) -> list[int]:
        top = {"steps": MAX_STEPS, "batch_size": 1_000_000, "depth": 1024}[info.field_name]
        if bad := [x for x in v if not 1 <= x <= top]:
            raise ValueError(f"values {bad} are outside 1..{top:,}; give positive {info.field_name} values")
        if len(set(v)) != len(v):
            raise ValueError(f"values repeat {v}; list each value once (add seeds for replicates)")
        return v

    @model_validator(mode="after")
    def _some(self) -> AxesSpec:
        if not self.steps and not self.batch_size and not self.depth:
            raise ValueError(
                "sweep.axes sweeps nothing: give `steps: [...]`, `batch_size: [...]` and/or `depth: [...]`, or remove it"
            )
        return self


class OptunaSpec(_Strict):
    """`sweep.search: optuna` (sweep/search.py): Optuna's TPE per width through Ray Tune's OptunaSearch."""

    trials_per_width: int = Field(
        20, ge=2, le=10_000, description="Trial budget of the narrowest width's search (wider ones: see budget_decay)."
    )
    budget_decay: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Each wider width's budget is this times the previous one's (at least warm_start_points + 1): "
        "wider widths start from what narrower ones found (µP: the same optimum); 1: the same budget at every width.",
    )
    warm_start_points: int = Field(
        3,
        ge=0,
        le=100,
        description="A wider width first runs the narrower width's best this many points, then its sampler is told "
        "the narrower width's trials shifted by the loss offset measured there; 0: every width searches from scratch.",
    )
    max_concurrent: int = Field(
        2, ge=1, le=1024, description="Trials running at once (TPE learns from finished ones: fewer is better informed)."
    )
    startup_trials: int = Field(8, ge=1, description="Random trials before TPE models the loss (capped at the budget).")
    sampler_seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed of the samplers (width i gets sampler_seed + i).")

    def budgets(self, n_widths: int) -> list[int]:
        """Trials per width, narrowest first: trials_per_width × budget_decay^i, rounded, floored at
        warm_start_points + 1 (its anchors and at least one sampled point; 2 without a warm start) and
        capped at trials_per_width. Wider trials cost more and, warm-started, need fewer to confirm
        the optimum µP says they share: decay 0.5 over 3 widths of cost ∝ width (×2 each) spends
        20·1 + 10·2 + 5·4 = 60 trial-units instead of 140."""
        floor = min(self.trials_per_width, max(2, self.warm_start_points + 1))
        return [max(floor, round(self.trials_per_width * self.budget_decay**i)) for i in range(n_widths)]


class SweepSpec(_Strict):
    widths: list[int] = Field(..., description="The width ladder, strictly increasing, e.g. [32, 64, 128].")
    grid: dict[str, list[float]] = Field(
        ...,
        description="Hyperparameters to tune and their grid values, e.g. {lr: [1e-3, 3e-3, 1e-2]}; with "
        "`search: optuna`, each one's box [low, high], searched on the scale `Hyperparameters` declares.",
    )
    search: Literal["grid", "optuna"] = Field(
        "grid",
        description="`grid`: every grid point at every width; `optuna`: Optuna's TPE per width in the box `grid` gives "
        "(Ray Tune's OptunaSearch), narrowest first, each wider width warm-started from the narrower one with a "
        "decreasing budget (`sweep.optuna`), then each width's replicates.",
    )
    optuna: OptunaSpec | None = Field(None, description="Budget and concurrency of `search: optuna` (defaults when omitted).")
    fixed: dict[str, float] = Field(
        default_factory=dict, description="Hyperparameters held fixed during the sweep (weight_decay, warmup_steps, ...)."
    )
    steps: int = Field(100, ge=1, le=MAX_STEPS, description="Training steps per trial.")
    batch_size: int = Field(16, ge=1, le=1_000_000, description="Sequences per step in each trial.")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="Seeds per grid point.")
    noise_seeds: int = Field(
        3,
        ge=0,
        le=32,
        description="Extra seeds run at each width's best grid point after the grid, so the sweep measures its own loss noise (used by every diagnostic); 0: none.",
    )
    max_trials: int = Field(
        2000,
        ge=1,
        description="Refuse a sweep with more trials than this (widths × grid × seeds); raise it deliberately for a big search.",
    )
    wall_clock_budget_s: float | None = Field(
        None,
        gt=0,
        description="Stop starting new trials after this many seconds (Ray Tune's time budget); finished trials are kept.",
    )
    cpus_per_trial: float = Field(1.0, gt=0, description="Ray CPUs per trial (also torch threads in the trial).")
    gpus_per_trial: float = Field(0.0, ge=0, description="Ray GPUs per trial (fractions share a GPU).")
    precision: Precision = Field(
        "fp32",
        description="Trial arithmetic: `fp32`, or `bf16` (forward and loss under torch.autocast to bfloat16, weights and "
        "optimizer in fp32), on the trial's GPU or on the CPU. The plan records it; a large run in another precision is warned.",
    )
    scheduler: Literal["fifo", "asha"] = Field(
        "fifo", description="`asha`: stop poor trials early (Ray Tune's ASHAScheduler); stopped trials get status `stopped`."
    )
    asha_grace_fraction: float = Field(
        0.25, gt=0, le=1, description="ASHA: fraction of `steps` every trial runs before it can be stopped."
    )
    asha_reduction_factor: float = Field(2.0, gt=1, description="ASHA: keep 1/reduction_factor of trials at each rung.")
    reports: int = Field(4, ge=1, le=100, description="Validation evaluations reported per trial (ASHA decides at these).")
    axes: AxesSpec | None = Field(
        None,
        description="Arms beyond the width ladder: `steps` and/or `batch_size` values swept at one width (`width`), "
        "each with the LR grid and the replicate seeds, for the laws of the optimal LR across horizon and batch.",
    )

    @field_validator("widths")
    @classmethod
    def _increasing(cls, v: list[int], info: ValidationInfo) -> list[int]:
        # One width only when it is the target's own (parse_spec passes target.width as context):
        # no width transfer, the sweep.axes arms carry the plan (issue 37).
        if len(v) < 2 and not (len(v) == 1 and (info.context or {}).get("target_width") == v[0]):
            raise ValueError(
                f"need at least 2 widths to see a trend, got {v}; or one width equal to target.width to transfer "
                "along steps, batch or depth only (sweep.axes)"
            )
        if any(w <= 0 for w in v):
            raise ValueError(f"widths must be positive, got {v}")
        if any(b <= a for a, b in itertools.pairwise(v)):
            raise ValueError(f"widths must be strictly increasing, got {v}; sort them and drop repeats")
        return v

    @field_validator("grid")
    @classmethod
    def _grid(cls, v: dict[str, list[float]]) -> dict[str, list[float]]:
        if not v:
            raise ValueError("the grid is empty: name at least one hyperparameter, e.g. `lr: [1e-3, 1e-2]`")
        for name, values in v.items():
            if name not in TUNABLE:
                raise ValueError(f"unknown hyperparameter {name!r}; tunable ones are {sorted(TUNABLE)}")
            if not values:
                raise ValueError(f"grid.{name} is empty: give at least one value")
            if name in LOG_SCALE and any(x <= 0 for x in values):
                raise ValueError(f"grid.{name} must be > 0 (it is searched on a log scale), got {values}")
            if len(set(values)) != len(values):
                raise ValueError(
                    f"grid.{name} repeats values {sorted({x for x in values if values.count(x) > 1})}; "
                    "list each value once (add seeds for replicates)"
                )
            _check_hps(name, values)
        return v

    @field_validator("fixed")
    @classmethod
    def _fixed(cls, v: dict[str, float]) -> dict[str, float]:
        for name in v:
            if name not in TUNABLE:
                raise ValueError(f"unknown hyperparameter {name!r}; known ones are {sorted(TUNABLE)}")
            _check_hps(name, [v[name]])
        return v

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"seeds repeat {v}; list each seed once")
        if bad := [s for s in v if not 0 <= s <= MAX_SEED]:
            raise ValueError(f"seeds {bad} are outside 0..{MAX_SEED} (what numpy, torch and Ray accept)")
        return v

    @model_validator(mode="after")
    def _search(self) -> SweepSpec:
        if self.search == "grid":
            if self.optuna is not None:
                raise ValueError("sweep.optuna is set but sweep.search is `grid`; set `search: optuna` or remove sweep.optuna")
            return self
        bad = {hp: v for hp, v in self.grid.items() if len(v) != 2 or not v[0] < v[1]}
        if bad:
            raise ValueError(
                f"with sweep.search: optuna each sweep.grid entry is the box [low, high] searched (low < high), got "
                f"{bad}; e.g. `lr: [1.0e-4, 1.0e-1]`"
            )
        if len(self.seeds) != 1:
            raise ValueError(
                f"sweep.search: optuna runs one seed per point, got seeds {self.seeds}; keep one seed "
                "(sweep.noise_seeds replicates each width's best point)"
            )
        if self.axes is not None:
            raise ValueError("sweep.search: optuna does not run sweep.axes arms yet; use `search: grid` or remove sweep.axes")
        return self

    @property
    def optuna_settings(self) -> OptunaSpec:
        """`sweep.optuna`, or its defaults when the spec leaves it out."""
        return self.optuna or OptunaSpec()

    @property
    def n_arms(self) -> int:
        """Width-ladder points plus the axes' extra (steps or batch_size) arms."""
        extra = 0 if self.axes is None else sum(len(self.axes_values(a)) for a in ("steps", "batch_size", "depth"))
        return len(self.widths) + extra

    def axes_values(self, axis: str) -> list[int]:
        """The axis's values swept besides the ladder's own (`sweep.steps` / `sweep.batch_size`; depth: the spec
        refuses model.depth among them)."""
        return [v for v in getattr(self.axes, axis, None) or [] if v != getattr(self, axis, None)]

    @property
    def n_bracket(self) -> int:
        """The most trials bracketing can add: `axes.bracket` lr values × the grid's seeds per axes arm."""
        if self.axes is None or "lr" not in self.grid:
            return 0
        return (self.n_arms - len(self.widths)) * self.axes.bracket * len(self.seeds)

    @property
    def n_trials(self) -> int:
        if self.search == "optuna":
            return sum(self.optuna_settings.budgets(len(self.widths))) + self.n_arms * self.noise_seeds
        return self.n_arms * (len(self.seeds) * math.prod(len(x) for x in self.grid.values()) + self.noise_seeds)


class CoordCheckSpec(_Strict):
    widths: list[int] | None = Field(
        None,
        min_length=2,
        description="Widths to check. Default: the sweep ladder plus the target width capped at 4× the widest.",
    )
    steps: int = Field(4, ge=2, le=20, description="Adam steps recorded.")
    lr: float = Field(1e-2, gt=0)
    max_slope: float = Field(
        0.25, gt=0, description="Fail when log(activation size) changes faster than this power of width (growing or shrinking)."
    )
    depths: list[int] | None = Field(
        None,
        min_length=2,
        description="Also check over depth at the base width (hptransfer.coordcheck_depth): the residual stream's change "
        "after a few Adam steps against these depths. Default: no depth check.",
    )
    max_depth_slope: float = Field(
        0.5,
        gt=0,
        description="Fail the depth check when the residual stream's change grows or shrinks faster than this power of "
        "depth (standard residuals: ≈ 1; depth-mup and completep: ≈ 0).",
    )

    @field_validator("widths", "depths")
    @classmethod
    def _positive(cls, v: list[int] | None, info) -> list[int] | None:
        if v is not None and any(w <= 0 for w in v):
            raise ValueError(f"{info.field_name} must be positive, got {v}")
        return v
