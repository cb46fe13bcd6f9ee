"""Plan files keep loading as the plan's evidence becomes typed (issue 21, item 3).

tests/data/old_plans holds plans written by the code before `diagnostics` was a typed model
(commit ffab51a): one from a real `hpt run`, the others from synthetic sweeps chosen to cover every
shape the section takes (no drift, drift, fast drift, undecided with mixture weights, two tuned
hyperparameters with divergence, two widths on a grid edge, sp-warmup, dp)."""

import copy
import math
from pathlib import Path

import pytest
import yaml

from hptransfer.errors import PlanError
from hptransfer.plan import load_plan, parse_plan, save_plan
from hptransfer.plan_diagnostics import Diagnostics, DriftFit, DriftVerdict, LossFit, OptimumSummary, OptimumTrend

OLD = sorted((Path(__file__).parent / "data" / "old_plans").glob("*.yaml"))
EMPTY = (None, [], {}, [None, None])
# Fields added since, whose default is the behaviour the old plans were made under: their value is that
# default, nothing else (depth: standard residuals; SIGTERM: a checkpoint when the last is ≥ 60 s old;
# ZeRO: no CPU offload).
LATER_DEFAULTS = {"depth_parametrization": "none", "stop_checkpoint_after_s": 60.0, "offload": "none", "hp_defaults": "family"}


def _same(raw, loaded, path="") -> list[str]:
    """Where `loaded` (the typed plan, dumped) differs from `raw` (the file). Keys the file did not
    have may only be empty: a field added to the model is null for an old plan (or the default that
    keeps the old behaviour, LATER_DEFAULTS), nothing else."""
    if not isinstance(raw, dict):
        return [] if raw == loaded else [f"{path}: file {raw!r}, loaded {loaded!r}"]
    out = [f"{path}.{k}: missing" for k in raw if k not in loaded]
    out += [d for k in raw if k in loaded for d in _same(raw[k], loaded[k], f"{path}.{k}")]
    new = [k for k in set(loaded) - set(raw) if loaded[k] not in EMPTY and LATER_DEFAULTS.get(k, object()) != loaded[k]]
    return out + [f"{path}.{k}: new {loaded[k]!r}" for k in new]


def test_the_fixtures_cover_every_verdict():
    diags = [yaml.safe_load(p.read_text())["diagnostics"] for p in OLD]
    assert {d["drift_verdict"]["verdict"] for d in diags} == {"none", "drift", "undecided"}
    assert {str(d["fast_transfer"]) for d in diags} == {"True", "False", "undecided"}
    assert {(d["drift_fit"] or {}).get("drift") for d in diags} == {None, "none", "fitted"}
    assert any(d["predicted_penalty_weights"] for d in diags) and any(d["loss_fit"] is None for d in diags)


@pytest.mark.parametrize("path", OLD, ids=[p.stem for p in OLD])
def test_an_old_plan_loads_with_the_same_values(path, tmp_path):
    raw = yaml.safe_load(path.read_text())
    plan = load_plan(path)
    assert _same(raw, plan.model_dump(mode="json")) == []
    # Typed all the way down: what the readers use is an attribute, with the file's value.
    d, rd = plan.diagnostics, raw["diagnostics"]
    assert isinstance(d, Diagnostics) and isinstance(d.drift_verdict, DriftVerdict)
    assert d.drift_verdict.verdict == rd["drift_verdict"]["verdict"] and d.fast_transfer == rd["fast_transfer"]
    for w, per in rd["optimum_by_width"].items():
        for hp, f in per.items():
            got = d.optimum_by_width[w][hp]
            assert isinstance(got, OptimumSummary) and (got.value, got.on_edge, got.ci) == (
                f["value"],
                f["on_edge"],
                None if f["ci"] is None else tuple(f["ci"]),
            )
    assert isinstance(d.drift_fit, DriftFit | None) and isinstance(d.loss_fit, LossFit | None)
    assert all(isinstance(t, OptimumTrend) for t in d.optimum_trend.values())
    assert d.predicted_penalty == rd["predicted_penalty"] and d.warnings == rd["warnings"]
    # Saved by today's code, it loads back as the same plan.
    assert load_plan(save_plan(plan, tmp_path / "again.yaml")) == plan


def test_a_plan_without_diagnostics_loads_with_empty_ones():
    raw = yaml.safe_load(OLD[0].read_text())
    del raw["diagnostics"]
    d = parse_plan(raw).diagnostics
    assert d == Diagnostics() and d.fast_transfer is None and d.warnings == [] and d.drift_fit is None


@pytest.mark.parametrize(
    "where, value, says",
    [
        (("predicted_penalty",), math.nan, "diagnostics.predicted_penalty"),
        (("drift_fit", "beta"), math.inf, "diagnostics.drift_fit.beta"),
        (("source_width",), "<script>", "diagnostics.source_width"),
        (("fast_transfer",), "maybe", "diagnostics.fast_transfer"),
        (("drift_verdict", "verdict"), "perhaps", "diagnostics.drift_verdict.verdict"),
        (("predicted_penaltyy",), 0.1, "diagnostics.predicted_penaltyy"),
        (("optimum_by_width", "32", "lr", "valeu"), 0.1, "diagnostics.optimum_by_width.32.lr.valeu"),
    ],
)
def test_a_hand_edited_diagnostic_is_refused_naming_its_field(where, value, says):
    """NaN or inf (never a setting), a string for a number, an unknown verdict, a misspelt key."""
    raw = yaml.safe_load((OLD[0].parent / "power_law_drift.yaml").read_text())
    node = raw["diagnostics"]
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    with pytest.raises(PlanError) as e:
        parse_plan(copy.deepcopy(raw))
    assert says in str(e.value)


def test_every_diagnostic_says_what_it_is():
    for model in (Diagnostics, OptimumSummary, LossFit, DriftFit, DriftVerdict, OptimumTrend):
        undocumented = [name for name, f in model.model_fields.items() if not f.description]
        assert not undocumented, (model.__name__, undocumented)


def test_a_misspelt_key_lists_the_keys_allowed_there():
    raw = yaml.safe_load(OLD[0].read_text())
    raw["diagnostics"]["drift_verdict"]["verdcit"] = "none"
    with pytest.raises(PlanError) as e:
        parse_plan(raw)
    assert "diagnostics.drift_verdict.verdcit: unknown key (typo?); allowed here: n_bounds, n_widths, reason, slope" in str(
        e.value
    )
