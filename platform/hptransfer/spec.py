"""The study spec: one YAML file describes the ladder, the grid, the rule and the target.

Validated once, at load, by pydantic; every error is reported at once with its YAML path, the bad
value and what is allowed (`hpt validate SPEC`). Defaults live on the fields, nowhere else.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hptransfer import architectures, vocab  # what validating an hf config and a tokenizer folder needs
from hptransfer.errors import Problem, SpecError, problems_from_validation
from hptransfer.hyperparameters import DEFAULT_HPS, LOG_SCALE, TUNABLE, Hyperparameters
from hptransfer.privacy import PRETRAIN, DPConfig

__all__ = [
    "DEFAULT_HPS",
    "LOG_SCALE",
    "RULE_NAMES",
    "RULE_TRAINING",
    "TUNABLE",
    "Hyperparameters",
    "RuleTraining",
    "SpecError",
    "StudySpec",
    "load_spec",
    "parse_spec",
    "rule_training",
    "spec_hash",
    "sweep_hash",
]

WeightDecayScaling = Literal["independent", "standard"]


class RuleTraining(BaseModel):
    """What a transfer rule changes in how models are trained — sweep trials and the large run alike
    (models/setup.py) — so a sweep's results depend on it and it is part of `sweep_hash`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    weight_decay_scaling: WeightDecayScaling = Field(
        "independent",
        description="µP's weight decay on hidden matrices: `independent` (MuAdamW's λ·m, η·λ constant in width) or "
        "`standard` (λ unchanged, η·λ shrinks as 1/m; paper 3, arXiv 2510.19093). SP ignores it (plain AdamW).",
    )

    def under(self, parametrization: str) -> RuleTraining:
        """What reaches training under `parametrization`: the scaling exists only under µP."""
        return self if parametrization == "mup" else RuleTraining()


# The transfer rules by name, with what each changes in training. Their code is registered in
# hptransfer.transfer.rules, each rule carrying its entry here (a test checks the two agree); listed
# here so the spec, its hashes and the trainer know it without importing the engine.
RULE_TRAINING: dict[str, RuleTraining] = {
    "mup": RuleTraining(),
    "mup-independent-wd": RuleTraining(),
    "mup-standard-wd": RuleTraining(weight_decay_scaling="standard"),
    "sp-warmup": RuleTraining(),
    "power-law": RuleTraining(),
    "dp": RuleTraining(),
}
RULE_NAMES = tuple(RULE_TRAINING)


def rule_training(rule: str) -> RuleTraining:
    """What rule `rule` changes in training; a ValueError naming the rules for an unknown name."""
    if rule not in RULE_TRAINING:
        raise ValueError(f"unknown transfer rule {rule!r}; choose one of {sorted(RULE_NAMES)}")
    return RULE_TRAINING[rule]


MAX_STEPS = 10_000_000  # far beyond any proxy or target run; catches typos like 1e12
MAX_WIDTH = 1_000_000  # far beyond any model's hidden size; keeps width ratios and costs finite
MAX_SEED = 2**32 - 1  # what numpy, torch and Ray all accept


class _Strict(BaseModel):
    # Unknown keys are typos until proven otherwise: `wdith:` must not be silently ignored.
    # NaN and ±inf are never a setting.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _fits_int64(cls, v: Any) -> Any:
        # numpy, torch and Ray hold 64-bit integers: a count or size like 10**30 is a typo, not a setting.
        if any(isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 2**63 for x in (v if isinstance(v, list) else [v])):
            raise ValueError(f"{v} is beyond any real setting (and 64-bit integers); use a realistic value")
        return v


Precision = Literal["fp32", "bf16"]
DEFAULT_PRECISION = "fp32"

BYTE_VOCAB = 256  # the `byte` tokenizer: one token per UTF-8 byte


class ModelSpec(_Strict):
    family: Literal["hf", "llama", "mlp"] = Field(
        "llama",
        description="`llama`: HF LlamaForCausalLM built from a fixed config; `hf`: any Hugging Face causal LM built from `config` (hptransfer.models.families says how width maps onto each architecture); `mlp`: a small per-position MLP LM for fast tests.",
    )
    config: dict[str, Any] | None = Field(
        None,
        description="family hf: the architecture, as an inline mapping with `model_type` and config fields (e.g. {model_type: qwen2, num_attention_heads: 4, num_key_value_heads: 1}) or the path of a local config.json (or its folder), read when the spec is loaded and kept inline in the plan. The ladder sets the width fields (hidden, FFN, heads, KV heads keeping this config's GQA group size, head size), the layer count (`depth`), positions (`seq_len`) and the vocabulary (the tokenizer's); everything else is used as given.",
    )
    depth: int = Field(
        2,
        ge=1,
        le=128,
        description="Number of transformer blocks (llama; hf, where it overrides the config's layer count) or hidden layers (mlp).",
    )
    head_dim: int = Field(
        16,
        ge=4,
        le=256,
        description="llama, hf: fixed head size; width = n_heads × head_dim, so attention scaling stays right as width grows.",
    )
    n_heads: int | None = Field(
        None,
        ge=1,
        description="hf: a fixed number of attention heads instead, so the head size width / n_heads grows with width (pair it with attn_scale: 1/d). Default: heads = width / head_dim.",
    )
    attn_scale: Literal["1/sqrt(d)", "1/d"] = Field(
        "1/sqrt(d)",
        description="hf: attention logits q·k/√d (standard) or q·k/d, µP's rule when the head size d grows (written √d_base/d: the base width is unchanged).",
    )
    ffn_mult: float = Field(4.0, gt=0, le=64, description="Feed-forward hidden size as a multiple of width.")
    seq_len: int = Field(64, ge=8, le=8192, description="Context length in tokens (bytes for the `byte` tokenizer).")
    parametrization: Literal["sp", "mup"] = Field(
        "mup",
        description="`mup`: µP via the `mup` package (MuReadout, or MuSharedReadout for tied embeddings; base shapes; MuAdamW); `sp`: standard parametrization.",
    )
    base_width: int | None = Field(
        None, ge=1, description="µP base width (width_mult = width / base_width). Default: the narrowest swept width."
    )
    vocab_size: int | None = Field(
        None,
        ge=2,
        le=10_000_000,
        description="Vocabulary size. Default: data.tokenizer's (256 for `byte`), filled in when the spec is loaded; a larger value pads the embedding.",
    )
    depth_parametrization: Literal["none", "depth-mup", "completep"] = Field(
        "none",
        description="How residual branches, hidden LRs and Adam's ε scale with depth L relative to `base_depth` "
        "(hptransfer.models.depth): `none` (standard residuals), `depth-mup` (branch ×(L/L_base)^-1/2, hidden LR "
        "×(L/L_base)^-1/2) or `completep` (branch ×L_base/L, hidden LR unchanged; arXiv 2505.01618). llama and hf only.",
    )
    base_depth: int | None = Field(
        None, ge=1, le=10_000, description="Depth the depth parametrization is relative to. Default: `depth`."
    )

    @field_validator("config", mode="before")
    @classmethod
    def _config(cls, v: Any) -> Any:
        if isinstance(v, (str, Path)):
            return _read_config_json(v)
        if isinstance(v, dict) and not isinstance(v.get("model_type"), str):
            raise ValueError("an inline model.config needs `model_type` (e.g. llama, mistral, qwen2, gpt2, gpt_neox)")
        return v

    @model_validator(mode="after")
    def _family(self) -> ModelSpec:
        if self.family == "mlp" and self.depth_parametrization != "none":
            raise ValueError(
                f"model.depth_parametrization={self.depth_parametrization!r} needs residual blocks whose branches end in a "
                "linear layer (family llama or hf); the mlp family's blocks end in a GELU: use depth_parametrization: none"
            )
        if self.family != "hf":
            given = [k for k in ("config", "n_heads") if getattr(self, k) is not None]
            given += ["attn_scale"] if self.attn_scale != "1/sqrt(d)" else []
            if given:
                raise ValueError(
                    f"model.{', model.'.join(given)} apply to family hf only (family is {self.family!r}); "
                    "remove them or set family: hf"
                )
            return self
        if self.config is None:
            raise ValueError(
                "family hf needs model.config: a mapping with model_type (e.g. {model_type: qwen2}) "
                "or the path of a local config.json"
            )
        problems = _hf_config_problems(self.config)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def at_depth(self, depth: int | None) -> ModelSpec:
        """This model with `depth` blocks, its depth rule still relative to this model's base depth."""
        if depth is None or depth == self.depth:
            return self
        return self.model_copy(update={"depth": depth, "base_depth": self.base_depth or self.depth})

    @property
    def vocab(self) -> int:
        """The vocabulary the model is built with."""
        return self.vocab_size or BYTE_VOCAB

    def width_problems(self, widths: list[int]) -> list[str]:
        """Why some widths cannot be built by this family (empty when all can)."""
        if self.family == "llama":
            bad = [w for w in widths if w % self.head_dim]
            return (
                [f"widths {bad} are not multiples of model.head_dim={self.head_dim}; llama width = n_heads × head_dim"]
                if bad
                else []
            )
        if self.family == "hf":
            return architectures.width_problems(self, widths)
        return []


def _read_config_json(v: str | Path) -> dict[str, Any]:
    path = Path(v).expanduser()
    try:
        path = path / "config.json" if path.is_dir() else path
        found = path.is_file()
    except OSError as e:  # e.g. a name longer than the filesystem allows
        raise ValueError(
            f"{str(v)[:80]!r} is not a usable path ({e.strerror}); give a local config.json "
            "(or its folder) or an inline mapping with model_type"
        ) from None
    if not found:
        raise ValueError(
            f"{path.resolve()} not found; give a local config.json (or its folder) or an inline mapping with model_type"
        )
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ValueError(f"{path} has no `model_type`; it must be a Hugging Face config.json")
    return data


def _hf_config_problems(config: dict[str, Any]) -> list[str]:
    mt = config["model_type"]
    try:
        cls = architectures.config_class(mt)
    except KeyError:
        return [
            f"model.config.model_type={mt!r} is unknown to transformers; check the spelling (llama, mistral, "
            "qwen2, gpt2, gpt_neox, ...) or upgrade transformers"
        ]
    if not architectures.is_causal_lm(mt):
        return [f"model.config.model_type={mt!r} is not a causal LM (AutoModelForCausalLM cannot build it)"]
    errs = []
    if "transformers_version" not in config and "architectures" not in config:  # written by hand: catch typos
        unknown = architectures.unknown_keys(config)
        if unknown:
            errs.append(f"model.config has keys {unknown} that {cls.__name__} does not know (typo?)")
    missing = architectures.missing_fields(mt)
    if missing:
        errs.append(
            f"model.config.model_type={mt!r} has no config fields {missing} for the width ladder to set; "
            "add its field names to hptransfer.models.families.ARCHITECTURES"
        )
    group = architectures.gqa_group(config)
    if group != int(group):
        errs.append(f"model.config: num_attention_heads is not a multiple of num_key_value_heads (group size {group:g})")
    return errs


class DataSpec(_Strict):
    corpus: Literal["stdlib", "prose", "files"] = Field(
        "stdlib",
        description="`stdlib`: the .py files of Python's standard library (ships with every Python); `prose`: the long descriptions (READMEs, English markdown/rst) of the installed Python packages, a different distribution (the private corpus of DP fine-tuning); `files`: your local files (`paths`), read through Hugging Face `datasets` and tokenized once by `hpt data prepare`.",
    )
    paths: tuple[str, ...] = Field(
        (),
        description="corpus files: glob patterns of the input files (`**` recurses); relative ones are resolved against the folder hpt runs in.",
    )
    format: Literal["text", "jsonl", "parquet"] | None = Field(
        None,
        description="corpus files: how to read them. `text`: documents are paragraphs (blank-line separated); `jsonl`, `parquet`: one document per row, in `text_field`. Default: by extension (.txt .md .text → text, .jsonl .json → jsonl, .parquet → parquet).",
    )
    text_field: str = Field(
        "text", min_length=1, description="corpus files, jsonl/parquet: the field (column) holding each document's text."
    )
    tokenizer: str = Field(
        "byte",
        min_length=1,
        description="`byte`: UTF-8 bytes, vocabulary 256; or a local tokenizer folder (what `tokenizer.save_pretrained(DIR)` writes), loaded with AutoTokenizer. The model's vocabulary follows it.",
    )
    cache_dir: str = Field(
        "~/.cache/hptransfer/data",
        description="corpus files: where prepared token files go, one folder per (inputs, format, tokenizer, split); a changed input or tokenizer is prepared again. Sweep trials and every large-run worker read it: on a multi-node cluster put it on shared storage (else each node prepares its own copy on first use).",
    )
    val_fraction: float = Field(
        0.1,
        gt=0,
        lt=0.5,
        description="Share held out for validation, by a stable hash of each file path (stdlib) or document text (files).",
    )
    max_files: int | None = Field(
        400,
        ge=10,
        description="stdlib, prose: use at most this many files (documents), sorted by hash, to keep start-up fast; null for all.",
    )
    max_epochs: float = Field(
        100.0,
        gt=0,
        description="Refuse a run that would pass over the training tokens more than this many times (steps × batch_size × seq_len / training tokens): a corpus too small for the requested steps.",
    )
    eval_batches: int = Field(8, ge=1, description="Validation batches averaged for val_loss.")

    @field_validator("paths")
    @classmethod
    def _absolute_paths(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        # Resolved once, at load: Ray workers run in other folders.
        return tuple(p if Path(p).expanduser().is_absolute() else str(Path.cwd() / p) for p in v)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_dir(cls, v: str) -> str:
        return v if v == "byte" or Path(v).expanduser().is_absolute() else str(Path.cwd() / v)

    @field_validator("cache_dir")
    @classmethod
    def _cache_dir(cls, v: str) -> str:
        return v if v.startswith("~") or Path(v).is_absolute() else str(Path.cwd() / v)

    @model_validator(mode="after")
    def _corpus(self) -> DataSpec:
        if self.corpus == "files" and not self.paths:
            raise ValueError("corpus files needs data.paths: glob patterns of your files, e.g. ['data/*.jsonl']")
        if self.corpus in ("stdlib", "prose"):
            given = [k for k in ("paths", "format") if getattr(self, k)] + (["tokenizer"] if self.tokenizer != "byte" else [])
            if given:
                raise ValueError(
                    f"data.{', data.'.join(given)} apply to corpus files (corpus is {self.corpus!r}, bytes "
                    "read in memory); set corpus: files or remove them"
                )
        return self


class AxesSpec(_Strict):
    """Arms of the sweep beyond the width ladder (issue 23): each value of `steps` or `batch_size`
    runs the LR grid and the replicate seeds at one width, the other axes at the ladder's."""

    width: int | None = Field(
        None, ge=1, le=MAX_WIDTH, description="The width the arms run at; one of sweep.widths. Default: the narrowest."
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
    def _increasing(cls, v: list[int]) -> list[int]:
        if len(v) < 2:
            raise ValueError(f"need at least 2 widths to see a trend, got {v}")
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
    def n_trials(self) -> int:
        if self.search == "optuna":
            return sum(self.optuna_settings.budgets(len(self.widths))) + self.n_arms * self.noise_seeds
        return self.n_arms * (len(self.seeds) * math.prod(len(x) for x in self.grid.values()) + self.noise_seeds)


class TransferSpec(_Strict):
    rule: str = Field("mup", description=f"Transfer rule by name: one of {', '.join(RULE_NAMES)}.")
    warmup_timescale: float | None = Field(
        None,
        gt=0,
        description="sp-warmup: timescale τ (steps) of the multiplicative warmup; null: 1/(lr·weight_decay) (paper 3).",
    )
    weight_decay: Literal["rule", "tau"] = Field(
        "rule",
        description="`rule`: weight decay as the rule carries it; `tau`: keep AdamW's EMA timescale τ = 1/(lr·weight_decay) "
        "a fixed share of the run, lr·weight_decay·steps constant from the ladder to the target (Wang & Aitchison, "
        "arXiv 2405.13698; docs/RESEARCH.md).",
    )


class TargetSpec(_Strict):
    width: int = Field(..., ge=1, le=MAX_WIDTH, description="Width of the large model.")
    steps: int | None = Field(None, ge=1, le=MAX_STEPS, description="Training steps of the large run. Default: the sweep's.")
    batch_size: int | None = Field(
        None, ge=1, le=1_000_000, description="Global batch (sequences) of the large run. Default: the sweep's."
    )
    depth: int | None = Field(
        None, ge=1, le=128, description="Blocks (layers) of the large model. Default: model.depth (the ladder's)."
    )


class TrainSpec(_Strict):
    workers: int = Field(2, ge=1, description="Ray Train workers (processes); DeepSpeed data-parallel ranks.")
    zero_stage: Literal[0, 1, 2, 3] = Field(1, description="DeepSpeed ZeRO stage.")
    cpus_per_worker: float = Field(1.0, gt=0)
    gpus_per_worker: float = Field(0.0, ge=0)
    precision: Precision = Field(
        "fp32",
        description="Large-run arithmetic: `fp32`, or `bf16` (DeepSpeed's bf16 mode: bf16 weights and compute, fp32 "
        "master weights in the optimizer). Match `sweep.precision`: the tuned LR was found in that precision.",
    )
    eval_every: int = Field(50, ge=1, description="Steps between validation evaluations in the large run.")
    checkpoint_every: int = Field(
        0, ge=0, description="Steps between DeepSpeed checkpoints (reported to Ray Train); 0: only the final one."
    )
    max_failures: int = Field(
        2, ge=0, description="Ray Train restarts of the worker group after a worker dies; each resumes from the last checkpoint."
    )
    keep_checkpoints: int = Field(
        2,
        ge=1,
        description="Checkpoints Ray Train keeps (older ones are deleted); a torn newest one falls back to the one before.",
    )
    stop_checkpoint_after_s: float = Field(
        60.0,
        ge=0,
        description="On SIGTERM (preemption) the large run stops at the next step boundary and writes a checkpoint "
        "unless its newest one is younger than this (seconds; 0: always). Keep the time one checkpoint takes "
        "under the pod's grace period (deploy: terminationGracePeriodSeconds).",
    )


class TrackingSpec(_Strict):
    uri: str | None = Field(None, description="MLflow tracking URI. Default: sqlite:///<study_dir>/mlflow.db.")
    experiment: str | None = Field(None, description="MLflow experiment name. Default: the study name.")


class RaySpec(_Strict):
    num_cpus: int | None = Field(None, ge=1, description="CPUs for a local Ray. Default: os.cpu_count().")
    object_store_mb: int = Field(
        512, ge=78, description="Local Ray object store size; Ray's default (30% of RAM) is far too large here."
    )


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


class DPSweepSpec(_Strict):
    """The DP sweep `hpt run` runs in the fine-tuning regime (`dp.init_from: pretrain`, dp/finetune.py)."""

    # ε = .inf is a setting here (the noise-free arm); kept as .inf in the study's spec.yaml.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=True, ser_json_inf_nan="constants")

    widths: list[int] | None = Field(
        None,
        description="Widths of the DP sweep, each fine-tuning a model pretrained at that width (target.width: the "
        "large run's own; a narrower one: the pretraining plan trained at that width). ≥ 2 widths: the plan checks "
        "whether the narrowest width's best (B, C, lr) hold at the widest (dp/width.py) and is made from the "
        "narrowest width's sweep. Null: [target.width].",
    )
    epsilons: list[float] = Field(
        default_factory=list,
        description="ε of the sweep; `.inf` adds the noise-free arm (the step curve the predicted-loss batch rule "
        "fits). Empty: [dp.epsilon, .inf].",
    )
    lrs: list[float] = Field(
        default_factory=list, description="LRs of the sweep (≥ 2 measure the LR-vs-B law). Empty: [dp.lr or 3e-3]."
    )
    seeds: list[int] = Field(
        default_factory=list, description="Seeds of each cell (≥ 2 give the across-width check an interval). Empty: sweep.seeds."
    )
    tolerance: float = Field(
        0.01,
        ge=0,
        lt=1,
        description="Across widths: the narrow width's choice holds when the 95% interval of its extra loss at the "
        "wide width over the wide width's own best stays below this fraction of that loss; does not hold when the "
        "interval lies above it; otherwise inconclusive.",
    )

    @field_validator("epsilons")
    @classmethod
    def _positive(cls, v: list[float]) -> list[float]:
        if bad := [e for e in v if not e > 0]:
            raise ValueError(f"each ε must be > 0 (or .inf for the noise-free arm), got {bad}")
        return v

    @field_validator("lrs")
    @classmethod
    def _lrs(cls, v: list[float]) -> list[float]:
        if bad := [x for x in v if not (0 < x < math.inf)]:
            raise ValueError(f"each lr must be a positive finite number, got {bad}")
        return v


class StudyDPConfig(DPConfig):
    """A study's `dp:` block: the budget (DPConfig) and, in the fine-tuning regime (`init_from:
    pretrain`), the private corpus and the DP sweep `hpt run` runs after the pretraining large run."""

    data: DataSpec | None = Field(
        None,
        description="init_from pretrain: the PRIVATE corpus the pretrained model is fine-tuned on (e.g. "
        "`{corpus: prose}`), while `data` is the public pretraining corpus. Null: `data` itself.",
    )
    sweep: DPSweepSpec = Field(DPSweepSpec(), description="init_from pretrain: the DP sweep of `hpt run`.")

    @property
    def finetunes_pretrained(self) -> bool:
        return self.init_from == PRETRAIN


class StudySpec(_Strict):
    # A safe path component and label value: starts with a letter or digit (never `.` or `..`).
    name: str = Field(
        ...,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$",
        description="Study name: folder and MLflow experiment name (letters, digits, `_.-`, at most 63, starting with a letter or digit).",
    )
    seed: int = Field(0, ge=0, le=MAX_SEED)
    model: ModelSpec = ModelSpec()
    data: DataSpec = DataSpec()
    sweep: SweepSpec
    transfer: TransferSpec = TransferSpec()
    target: TargetSpec
    train: TrainSpec = TrainSpec()
    tracking: TrackingSpec = TrackingSpec()
    ray: RaySpec = RaySpec()
    coord_check: CoordCheckSpec = CoordCheckSpec()
    dp: StudyDPConfig | None = Field(None, description="Differentially private fine-tuning budget (see `hpt dp-plan --help`).")

    @model_validator(mode="before")
    @classmethod
    def _vocab_follows_tokenizer(cls, data: Any) -> Any:
        """model.vocab_size defaults to the tokenizer's, read once here so the plan carries it."""
        section = data.get("data") if isinstance(data, dict) else None
        tokenizer = section.get("tokenizer") if isinstance(section, dict) else getattr(section, "tokenizer", None)
        if not isinstance(tokenizer, str) or tokenizer == "byte":
            return data
        return vocab.fill_vocab_size(data, tokenizer)

    @model_validator(mode="after")
    def _cross(self) -> StudySpec:
        errs = self.model.width_problems(sorted({*self.sweep.widths, self.target.width, self.base_width}))
        if self.data.tokenizer != "byte":
            errs += vocab.tokenizer_problems(self.data.tokenizer, self.model.vocab_size)
        if self.target.width < self.sweep.widths[-1]:
            errs.append(
                f"target.width={self.target.width} is narrower than the widest swept width "
                f"{self.sweep.widths[-1]}; transfer goes to a wider model"
            )
        ax = self.sweep.axes
        if ax is not None and ax.width is not None and ax.width not in self.sweep.widths:
            errs.append(f"sweep.axes.width={ax.width} is not one of sweep.widths {self.sweep.widths}; pick a swept width")
        if ax is not None and self.model.depth in ax.depth:
            errs.append(
                f"sweep.axes.depth={ax.depth} lists model.depth={self.model.depth}, the ladder's own depth; leave it out "
                "(the width ladder runs it)"
            )
        if self.model.base_width is not None and self.model.base_width > self.sweep.widths[0]:
            errs.append(f"model.base_width={self.model.base_width} exceeds the narrowest width {self.sweep.widths[0]}")
        if self.transfer.rule not in RULE_NAMES:
            errs.append(f"transfer.rule={self.transfer.rule!r} is unknown; choose one of {sorted(RULE_NAMES)}")
        elif self.transfer.rule == "dp" and self.dp is None:
            errs.append(
                "transfer.rule='dp' needs a `dp:` block (epsilon, delta, dataset_size, epochs); "
                "add one (see search_spaces/dp-finetune.yaml) or choose another rule"
            )
        if self.dp is not None:
            errs += self._dp_problems()
        if self.sweep.n_trials > self.sweep.max_trials:
            errs.append(
                f"the sweep has {self.sweep.n_trials} trials (widths × grid × seeds), above "
                f"sweep.max_trials={self.sweep.max_trials}; shrink the grid or raise sweep.max_trials"
            )
        if errs:
            raise ValueError("; ".join(errs))
        return self

    def _dp_problems(self) -> list[str]:
        """The fine-tuning regime's cross-field rules (dp/finetune.py)."""
        dp, errs = self.dp, []
        assert dp is not None
        if not dp.finetunes_pretrained:
            if dp.data is not None or "sweep" in dp.model_fields_set:
                errs.append(
                    "dp.data and dp.sweep apply to the fine-tuning regime (dp.init_from: pretrain: `hpt run` pretrains, "
                    "then fine-tunes privately); set dp.init_from: pretrain or remove them"
                )
            return errs
        if self.transfer.rule == "dp":
            errs.append(
                "dp.init_from: pretrain pretrains non-privately first: transfer.rule is the pretraining ladder's rule "
                "(e.g. mup), not 'dp' (the private plan uses rule dp itself)"
            )
        if self.model.family == "mlp":
            errs.append(
                "dp.init_from: pretrain needs a model with a Hugging Face form to hand off (model.family llama or hf), not mlp"
            )
        widths = dp.sweep.widths or [self.target.width]
        if too_wide := [w for w in widths if w > self.target.width]:
            errs.append(f"dp.sweep.widths {too_wide} exceed target.width={self.target.width}; the fine-tuned model is the target")
        if widths != sorted(set(widths)):
            errs.append(f"dp.sweep.widths={widths} must be strictly increasing")
        errs += [f"dp.sweep.widths: {e}" for e in self.model.width_problems(sorted(set(widths)))]
        return errs

    # Derived values, one place.
    @property
    def base_width(self) -> int:
        return self.model.base_width or self.sweep.widths[0]

    @property
    def target_steps(self) -> int:
        return self.target.steps or self.sweep.steps

    @property
    def target_batch_size(self) -> int:
        return self.target.batch_size or self.sweep.batch_size

    @property
    def target_depth(self) -> int:
        return self.target.depth or self.model.depth

    @property
    def axes_width(self) -> int:
        """The width the axes' arms run at."""
        return (self.sweep.axes.width if self.sweep.axes else None) or self.sweep.widths[0]


def _check_hps(name: str, values: list[float]) -> None:
    """Each value must be a valid setting of that hyperparameter (finite, in range)."""
    bad = []
    for x in values:
        try:
            Hyperparameters.model_validate({name: x})
        except ValidationError as e:
            bad.append(f"{x!r}: {e.errors()[0]['msg']}")
    if bad:
        raise ValueError(f"{name} values out of range: {'; '.join(bad)}")


def _allowed_keys(loc: tuple) -> list[str]:
    """Field names of the spec section that holds loc[-1] (for "unknown key" errors)."""
    model: Any = StudySpec
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        ann = getattr(field, "annotation", None)
        model = next((a for a in getattr(ann, "__args__", (ann,)) if hasattr(a, "model_fields")), None)
        if model is None:
            return []
    return sorted(getattr(model, "model_fields", {}))


def parse_spec(data: Any, source: str = "<spec>") -> StudySpec:
    if not isinstance(data, dict):
        raise SpecError(source, [Problem("", "the spec must be a YAML mapping", type(data).__name__)])
    try:
        return StudySpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(source, problems_from_validation(e, allowed_keys=_allowed_keys)) from None


def load_spec(path: str | Path) -> StudySpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError(str(path), [Problem("", "spec file not found", str(path), "check the path")])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise SpecError(str(path), [Problem("", f"not valid YAML: {e}")]) from None
    return parse_spec(data, str(path))


def _unset_later_fields(spec: StudySpec) -> dict:
    """Fields added after studies existed, left out of the hashes while they hold their default, so
    an existing study's hashes (its results table's `spec_hash`, its trial markers) stay the same."""
    out: dict[str, set[str]] = {}
    for section, name, default in (  # issue 24
        ("model", "depth_parametrization", "none"),
        ("model", "base_depth", None),
        ("coord_check", "depths", None),
        ("coord_check", "max_depth_slope", 0.5),
    ):
        if getattr(getattr(spec, section), name) == default:
            out.setdefault(section, set()).add(name)
    for section in ("sweep", "train"):
        if getattr(spec, section).precision == DEFAULT_PRECISION:
            out.setdefault(section, set()).add("precision")
    later = {"sweep": ("axes", None), "target": ("depth", None), "transfer": ("weight_decay", "rule")}  # issue 23
    for section, (name, default) in later.items():
        if getattr(getattr(spec, section), name) == default:
            out.setdefault(section, set()).add(name)
    if spec.sweep.search == "grid":  # issue 25: a grid sweep keeps its hash
        out.setdefault("sweep", set()).update({"search", "optuna"})
    return out


def sweep_hash(spec: StudySpec, training: RuleTraining | None = None) -> str:
    """Hash of what the sweep's results depend on (model, data, sweep, seed, and what the rule changes
    in training: RuleTraining): a results table or an interrupted sweep belongs to it. Editing the
    target, or the rule to one that trains the same way, keeps the results valid.

    `training` (default: the spec's rule's, under its parametrization) is hashed only where it differs
    from the default (independent weight decay), so a study swept before it entered the hash — under
    any rule but `mup-standard-wd` — keeps its hash and resumes."""
    training = (training or rule_training(spec.transfer.rule)).under(spec.model.parametrization)
    blob = spec.model_dump_json(include={"model", "data", "sweep", "seed"}, exclude=_unset_later_fields(spec))
    if training != RuleTraining():
        blob += training.model_dump_json()
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def spec_hash(spec: StudySpec) -> str:
    return hashlib.sha256(spec.model_dump_json(exclude=_unset_later_fields(spec)).encode()).hexdigest()[:16]
