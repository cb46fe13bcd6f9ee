"""The whole study spec (`StudySpec`), its parsing with every error at once, and the hashes that bind
results and trial markers to what they depend on."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from hptransfer import vocab  # what validating an hf config and a tokenizer folder needs
from hptransfer.errors import Problem, SpecError, problems_from_validation
from hptransfer.family_defaults import fill_fixed
from hptransfer.spec.base import DEFAULT_PRECISION, MAX_SEED, RULE_NAMES, RuleTraining, _Strict, rule_training
from hptransfer.spec.data import DataSpec
from hptransfer.spec.dp import StudyDPConfig
from hptransfer.spec.model import ModelSpec
from hptransfer.spec.sweep import CoordCheckSpec, SweepSpec
from hptransfer.spec.target import FormulaPriorSpec, TargetSpec, TransferSpec
from hptransfer.spec.train import RaySpec, TrackingSpec, TrainSpec


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

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data: Any) -> Any:
        """sweep.fixed gains the family's measured defaults for what the sweep neither fixes nor
        searches (family_defaults.py; model.hp_defaults: package turns it off). Filled here, once, so
        every stage, the plan and the hashes see the values the trials ran with."""
        if not isinstance(data, dict) or not isinstance(data.get("sweep"), dict):
            return data
        model = data.get("model") if isinstance(data.get("model"), dict) else {}
        if model.get("hp_defaults", "family") != "family":
            return data
        sweep = data["sweep"]
        fixed, grid = sweep.get("fixed") or {}, sweep.get("grid") or {}
        if not isinstance(fixed, dict) or not isinstance(grid, dict):
            return data  # the field validators say what is wrong
        filled = fill_fixed(fixed, grid, model.get("family", "llama"), model.get("parametrization", "mup"))
        return data if filled == fixed else {**data, "sweep": {**sweep, "fixed": filled}}

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
            if dp.data is not None or "sweep" in dp.model_fields_set or dp.tuning_data is not None:
                errs.append(
                    "dp.data, dp.sweep and dp.tuning_data apply to the fine-tuning regime (dp.init_from: pretrain: `hpt run` "
                    "pretrains, then fine-tunes privately); set dp.init_from: pretrain or remove them"
                )
            return errs
        if dp.tuning == "private":
            if dp.tuning_data is not None:
                errs.append("dp.tuning_data is the public tuning corpus of dp.tuning: public; remove it or set dp.tuning: public")
            if dp.sweep.epsilons:
                errs.append(
                    f"dp.sweep.epsilons={list(dp.sweep.epsilons)}: under dp.tuning: private every trial's ε comes from the "
                    "budget (dp.private_tuning.share) and there is no noise-free arm; remove dp.sweep.epsilons"
                )
            if dp.sweep.widths and len(dp.sweep.widths) > 1:
                errs.append(
                    f"dp.sweep.widths={list(dp.sweep.widths)}: dp.tuning: private tunes at one width (an across-width "
                    "check would be more private trials); give one width"
                )
        elif dp.private_tuning != type(dp.private_tuning)():  # a spec written back in full holds the default
            errs.append("dp.private_tuning applies to dp.tuning: private; remove it or set dp.tuning: private")
        private = dp.data or self.data
        tuning = dp.tuning_data or self.data
        if dp.tuning == "public" and tuning.model_dump() == private.model_dump():
            which = "dp.tuning_data" if dp.tuning_data is not None else "dp.tuning_data (null: `data`)"
            errs.append(
                f"{which} is the private corpus ({private.corpus}"
                + ("; dp.data is null, so `data` itself is private" if dp.data is None else ", dp.data")
                + "): the DP sweep would tune on the private data outside any accountant; set dp.tuning_data to a corpus "
                "you can publish (e.g. {corpus: stdlib}), or dp.data to the private corpus"
            )
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
        return (self.sweep.axes.width if self.sweep.axes else None) or mid_width(self.sweep.widths)


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
        target = data.get("target")
        width = target.get("width") if isinstance(target, dict) else None
        return StudySpec.model_validate(data, context={"target_width": width})
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


def mid_width(widths: list[int]) -> int:
    """The middle of the ladder (the lower middle for an even count): sweep.axes' default arm width."""
    ordered = sorted(widths)
    return ordered[(len(ordered) - 1) // 2]


def _unset_later_fields(spec: StudySpec) -> dict:
    """Fields added after studies existed, left out of the hashes while they hold their default, so
    an existing study's hashes (its results table's `spec_hash`, its trial markers) stay the same
    (pydantic's `exclude`: a section's set of names, or a dict where a nested field is left out)."""
    out: dict[str, Any] = {}
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
    # Issue 36 item 1: what hp_defaults changes is in sweep.fixed (it fills it), so the choice itself
    # never enters a hash: the same trials, the same hash, however their values were given.
    out.setdefault("model", set()).add("hp_defaults")
    later = {"sweep": ("axes", None), "target": ("depth", None), "transfer": ("weight_decay", "rule")}  # issue 23
    for section, (name, default) in later.items():
        if getattr(getattr(spec, section), name) == default:
            out.setdefault(section, set()).add(name)
    if spec.transfer.formula_prior == FormulaPriorSpec():  # issue 36 item 3
        out.setdefault("transfer", set()).add("formula_prior")
    if spec.sweep.search == "grid":  # issue 25: a grid sweep keeps its hash
        out.setdefault("sweep", set()).update({"search", "optuna"})
    if spec.sweep.axes is not None and spec.sweep.axes.bracket == 2:  # issue 37 item 4, at its default
        out["sweep"] = {**dict.fromkeys(out.get("sweep", set()), True), "axes": {"bracket": True}}
    return out


def sweep_hash(spec: StudySpec, training: RuleTraining | None = None) -> str:
    """Hash of what the sweep's results depend on (model, data, sweep, seed, and what the rule changes
    in training: RuleTraining): a results table or an interrupted sweep belongs to it. Editing the
    target, or the rule to one that trains the same way, keeps the results valid.

    `training` (default: the spec's rule's, under its parametrization) is hashed only where it differs
    from the default (independent weight decay), so a study swept before it entered the hash — under
    any rule but `mup-standard-wd` — keeps its hash and resumes."""
    training = (training or rule_training(spec.transfer.rule)).under(spec.model.parametrization)
    suffix = ""
    # Issue 37 item 4: the arms' default width moved from the narrowest to the middle. A study that
    # named its width, or whose two agree (two widths), keeps its hash; one that relied on the old
    # default with 3+ widths gets a new one, as its arms would now run at another width.
    if spec.sweep.axes is not None and spec.sweep.axes.width is None and spec.axes_width != min(spec.sweep.widths):
        suffix = f"axes_width={spec.axes_width}"
    blob = spec.model_dump_json(include={"model", "data", "sweep", "seed"}, exclude=_unset_later_fields(spec)) + suffix
    if training != RuleTraining():
        blob += training.model_dump_json()
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def package_defaults_sweep_hash(spec: StudySpec) -> str | None:
    """The sweep hash this spec had before the family defaults (issue 36 item 1): the same spec at
    model.hp_defaults: package without the values they filled; None where they filled nothing. Lets
    a sweep or a table made by an earlier version be named as such, with the setting that keeps it."""
    from hptransfer.family_defaults import family_defaults

    d = family_defaults(spec.model.family, spec.model.parametrization)
    if d is None or spec.model.hp_defaults != "family":
        return None
    raw = spec.model_dump(mode="json")
    raw["model"]["hp_defaults"] = "package"
    raw["sweep"]["fixed"] = {k: v for k, v in raw["sweep"]["fixed"].items() if d.values.get(k) != v}
    return sweep_hash(parse_spec(raw))


PACKAGE_DEFAULTS_HINT = (
    "it was swept at the package defaults (output_mult 1, init_std 0.02) before this version filled the family's "
    "measured defaults into sweep.fixed: set `model.hp_defaults: package` to keep it as it was swept"
)


def spec_hash(spec: StudySpec) -> str:
    return hashlib.sha256(spec.model_dump_json(exclude=_unset_later_fields(spec)).encode()).hexdigest()[:16]
