"""Issue 36 item 1: the family's measured defaults fill what a µP Llama sweep neither fixes nor
searches, reach the trials, the hashes and the plan, and step aside for a user's value."""

from __future__ import annotations

import pytest

from hptransfer.family_defaults import FAMILY_DEFAULTS, fill_fixed
from hptransfer.spec import parse_spec, sweep_hash
from hptransfer.sweep.trial import trial_hps

from conftest import tiny_spec_dict

LLAMA = {"family": "llama", "depth": 1, "head_dim": 8, "seq_len": 16, "parametrization": "mup"}
MEASURED = FAMILY_DEFAULTS[("llama", "mup")].values


def _spec(model=None, sweep=None):
    return parse_spec(tiny_spec_dict(model={**LLAMA, **(model or {})}, sweep=sweep or {}))


def test_a_mup_llama_sweep_runs_at_the_measured_defaults():
    spec = _spec()
    hps = trial_hps(spec, {"lr": 0.03})
    assert hps.output_mult == pytest.approx(MEASURED["output_mult"], rel=1e-12)
    assert hps.init_std == pytest.approx(MEASURED["init_std"], rel=1e-12)
    assert MEASURED["output_mult"] != 1.0 and MEASURED["init_std"] != 0.02  # they differ from the package's


def test_package_defaults_sp_and_other_families_are_left_alone():
    for spec in (_spec(model={"hp_defaults": "package"}), _spec(model={"parametrization": "sp"})):
        hps = trial_hps(spec, {"lr": 0.03})
        assert hps.output_mult == pytest.approx(1.0) and hps.init_std == pytest.approx(0.02)
    mlp = parse_spec(tiny_spec_dict())
    assert "output_mult" not in mlp.sweep.fixed and "init_std" not in mlp.sweep.fixed


def test_a_users_fixed_or_searched_value_wins():
    spec = _spec(sweep={"fixed": {"warmup_steps": 2, "output_mult": 2.0}, "grid": {"lr": [0.01, 0.1], "init_std": [0.01, 0.03]}})
    assert spec.sweep.fixed["output_mult"] == pytest.approx(2.0)
    assert "init_std" not in spec.sweep.fixed  # searched: the grid's values reach the trials
    assert trial_hps(spec, {"lr": 0.01, "init_std": 0.03}).init_std == pytest.approx(0.03)
    assert fill_fixed({"init_std": 0.1}, {}, "llama", "mup")["init_std"] == pytest.approx(0.1)


def test_the_sweep_hash_follows_the_values_the_trials_ran_with():
    family, package = _spec(), _spec(model={"hp_defaults": "package"})
    assert sweep_hash(family) != sweep_hash(package)  # a sweep at the old defaults does not resume under the new
    explicit = _spec(model={"hp_defaults": "package"}, sweep={"fixed": {"warmup_steps": 2, **MEASURED}})
    assert sweep_hash(explicit) == sweep_hash(family)  # the same trials, the same hash
    # loading the dumped spec again fills nothing twice
    again = parse_spec(family.model_dump(mode="json"))
    assert again.sweep.fixed == family.sweep.fixed and sweep_hash(again) == sweep_hash(family)


def test_a_bad_hp_defaults_names_the_field():
    from hptransfer.errors import SpecError

    with pytest.raises(SpecError) as e:
        _spec(model={"hp_defaults": "measured"})
    assert "model.hp_defaults" in str(e.value) and "measured" in str(e.value)


def test_a_table_swept_before_the_family_defaults_names_the_setting_that_transfers_it():
    """A study swept at the package defaults (before this version) and transferred now: its table's hash
    is the spec's under hp_defaults: package, and the refusal says so and how to go on."""
    import pandas as pd

    from hptransfer.errors import ResultsError
    from hptransfer.transfer.results import check_results_belong

    spec, old = _spec(), _spec(model={"hp_defaults": "package"})
    table = pd.DataFrame({"width": [16, 32], "lr": [0.03, 0.03], "spec_hash": [sweep_hash(old)] * 2})
    with pytest.raises(ResultsError) as e:
        check_results_belong(table, spec, sweep_hash(spec), "sweep_results.csv")
    assert "model.hp_defaults: package" in str(e.value) and sweep_hash(old) in str(e.value)
    check_results_belong(table, old, sweep_hash(old), "sweep_results.csv")  # transferred as it was swept
    other = table.assign(spec_hash="0123456789abcdef")
    with pytest.raises(ResultsError) as e:
        check_results_belong(other, spec, sweep_hash(spec), "sweep_results.csv")
    assert "hp_defaults" not in str(e.value) and "another sweep" in str(e.value)


def test_a_sweep_stamped_before_the_family_defaults_is_named_in_the_resume_refusal():
    """The sweep's resume check: the refusal names hp_defaults: package when the stamp is this spec's
    sweep as the earlier version ran it, and says nothing more for any other sweep."""
    from types import SimpleNamespace

    from hptransfer.spec import package_defaults_sweep_hash
    from hptransfer.sweep.runner import _old_defaults_hint

    spec = _spec()
    study = SimpleNamespace(spec=spec)
    old = package_defaults_sweep_hash(spec)
    assert old == sweep_hash(_spec(model={"hp_defaults": "package"}))
    assert "model.hp_defaults: package" in _old_defaults_hint(study, f"{old}/ladder")
    assert _old_defaults_hint(study, f"{sweep_hash(spec)}/ladder") == "" and _old_defaults_hint(study, "feedbeef/ladder") == ""
    assert package_defaults_sweep_hash(parse_spec(tiny_spec_dict())) is None  # mlp: nothing was filled
