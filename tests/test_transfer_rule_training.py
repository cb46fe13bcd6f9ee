"""What a rule changes in training binds a sweep's results to it (issue 21, item 3).

µP's weight-decay scaling is chosen by the rule (`mup-standard-wd`: standard, every other rule:
independent) and sweep trials train under it, so results swept under one scaling must not feed a
plan under the other. `tests/data/old_study` is a real study swept by `hpt run` before the scaling
entered the sweep hash (its spec.yaml and sweep_results.csv, as the sweep wrote them)."""

import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hptransfer.errors import ResultsError
from hptransfer.models.setup import weight_decay_scaling
from hptransfer.pipeline import transfer_stage
from hptransfer.spec import RULE_NAMES, RULE_TRAINING, load_spec
from hptransfer.study import Study
from hptransfer.transfer.engine import check_results_belong, make_plan, read_results
from hptransfer.transfer.rules import RULES, Evidence, Target

OLD_STUDY = Path(__file__).parent / "data" / "old_study"


def _study(tmp_path: Path, rule: str, table: pd.DataFrame | None = None) -> Study:
    """The old study with its spec's rule edited to `rule` (what a user does to re-plan)."""
    root = tmp_path / f"study-{rule}"
    shutil.copytree(OLD_STUDY, root)
    spec = yaml.safe_load((root / "spec.yaml").read_text())
    spec["transfer"]["rule"] = rule
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    if table is not None:
        table.to_csv(root / "sweep_results.csv", index=False)
    return Study.from_dir(root)


def test_a_sweep_made_before_the_change_keeps_its_hash():
    """Independent scaling (the default) adds nothing to the hash: studies swept before still resume."""
    table = pd.read_csv(OLD_STUDY / "sweep_results.csv", dtype={"spec_hash": str})
    spec = load_spec(OLD_STUDY / "spec.yaml")
    assert spec.transfer.rule == "mup"
    assert set(table["spec_hash"]) == {Study(spec, OLD_STUDY).sweep_hash}


def test_rules_that_share_the_scaling_keep_the_results(tmp_path):
    assert transfer_stage(_study(tmp_path, "mup-independent-wd")).rule == "mup-independent-wd"
    for rule in ("mup", "power-law", "sp-warmup"):  # what transfer_stage checks, without its MLflow logging
        study = _study(tmp_path, rule)
        table = read_results(study.paths.sweep_results)
        check_results_belong(table, study.spec, study.sweep_hash, "sweep_results.csv")
        assert make_plan(study.spec, table).rule == rule


# What each rule trains with, written out here (not read from the registry): only mup-standard-wd
# keeps λ on µP's hidden matrices (paper 3, arXiv 2510.19093); every other rule is MuAdamW's λ·m.
SCALING = {
    "mup": "independent",
    "mup-independent-wd": "independent",
    "mup-standard-wd": "standard",
    "sp-warmup": "independent",
    "power-law": "independent",
    "dp": "independent",
}


def test_every_rule_carries_what_it_changes_in_training():
    """One registry: each rule object carries the spec's entry, which the trainer and the hash read."""
    assert list(RULES) == list(RULE_NAMES) and set(RULES) == set(SCALING)
    for name, rule in RULES.items():
        assert rule.name == name and rule.training is RULE_TRAINING[name]
        assert weight_decay_scaling(name) == rule.training.weight_decay_scaling == SCALING[name], name
    # The plan's µP multipliers say the same scaling the trials trained with: at width ratio 256/32 = 8,
    # λ·m is a weight-decay multiplier of 8 on hidden matrices, standard scaling keeps 1.
    ev = Evidence(optima={32: {"lr": 1e-3}, 64: {"lr": 1e-3}}, fixed={"weight_decay": 0.1}, base_width=32, parametrization="mup")
    target = Target(width=256, steps=10, batch_size=8, proxy_steps=10, proxy_batch_size=8)
    expected = {"mup": 8.0, "mup-independent-wd": 8.0, "mup-standard-wd": 1.0, "power-law": 8.0}
    for name, wd_multiplier in expected.items():
        wd = RULES[name](ev, target).param_group_multipliers["hidden_matrices"]["weight_decay"]
        assert wd == pytest.approx(wd_multiplier, rel=1e-12), name


def test_a_plan_under_another_weight_decay_scaling_is_refused(tmp_path):
    """Swept under `mup` (independent weight decay), re-planned under `mup-standard-wd`: the trials
    were trained with λ·m on the hidden matrices, the plan would assume λ. Refused, saying why."""
    with pytest.raises(ResultsError) as e:
        transfer_stage(_study(tmp_path, "mup-standard-wd"))
    text = str(e.value)
    assert "transfer.rule `mup-standard-wd`" in text
    assert "trained with µP's independent weight-decay scaling" in text
    assert "--restart" in text and "mup-independent-wd" in text  # the fixes: re-sweep, or a rule that matches


def test_the_other_direction_is_refused_too(tmp_path):
    """Swept under `mup-standard-wd` (its rows carry that study's sweep hash), planned under `mup`."""
    standard = _study(tmp_path, "mup-standard-wd")
    table = pd.read_csv(OLD_STUDY / "sweep_results.csv", dtype={"spec_hash": str}).assign(spec_hash=standard.sweep_hash)
    table.to_csv(standard.paths.sweep_results, index=False)
    assert transfer_stage(standard).rule == "mup-standard-wd"  # its own rule: accepted
    with pytest.raises(ResultsError) as e:
        transfer_stage(_study(tmp_path, "mup", table))
    text = str(e.value)
    assert "transfer.rule `mup`" in text and "trained with µP's standard weight-decay scaling" in text
    assert "--restart" in text and "mup-standard-wd" in text


def test_under_sp_the_scaling_changes_nothing_so_it_binds_nothing(tmp_path):
    """SP trains with AdamW's own weight decay whatever the rule: editing mup-standard-wd ↔ mup on an
    SP study keeps its results (the hash binds what training used, not the rule's name)."""
    sp = _study(tmp_path, "mup")
    spec = yaml.safe_load(sp.paths.spec.read_text())
    spec["model"]["parametrization"] = "sp"
    sp.paths.spec.write_text(yaml.safe_dump(spec))
    sp = Study.from_dir(sp.root)
    table = pd.read_csv(OLD_STUDY / "sweep_results.csv", dtype={"spec_hash": str}).assign(spec_hash=sp.sweep_hash)
    spec["transfer"]["rule"] = "mup-standard-wd"
    sp.paths.spec.write_text(yaml.safe_dump(spec))
    table.to_csv(sp.paths.sweep_results, index=False)
    edited = Study.from_dir(sp.root)
    assert edited.sweep_hash == sp.sweep_hash
    check_results_belong(read_results(edited.paths.sweep_results), edited.spec, edited.sweep_hash, "sweep_results.csv")
