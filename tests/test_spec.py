"""The study spec: every shipped spec validates; each kind of broken spec gets a clear error that
names the YAML path, the bad value and what is allowed — all errors at once."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from hptransfer.spec import SpecError, load_spec, parse_spec

from conftest import ROOT, tiny_spec_dict

SHIPPED = sorted((ROOT / "search_spaces").glob("*.yaml"))


def test_there_are_shipped_specs():
    assert any(p.name == "quickstart.yaml" for p in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_spec_validates(path):
    spec = load_spec(path)
    assert spec.name and spec.sweep.widths


def _problems(d) -> list[tuple[str, str, object]]:
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    return e.value.problems


BROKEN = {
    "empty grid": ({"sweep": {"grid": {}}}, "sweep.grid", "empty"),
    "empty grid values": ({"sweep": {"grid": {"lr": []}}}, "sweep.grid", "lr is empty"),
    "widths not increasing": ({"sweep": {"widths": [32, 16]}}, "sweep.widths", "strictly increasing"),
    "one width": ({"sweep": {"widths": [32]}}, "sweep.widths", "at least 2"),
    "unknown hyperparameter": ({"sweep": {"grid": {"learning_rate": [0.1]}}}, "sweep.grid", "unknown hyperparameter"),
    "negative lr on log grid": ({"sweep": {"grid": {"lr": [-1.0, 0.1]}}}, "sweep.grid", "must be > 0"),
    "typo key": ({"model": {"famly": "llama"}}, "model.famly", "unknown key"),
    "bad family": ({"model": {"family": "gpt9"}}, "model.family", "'llama' or 'mlp'"),
    "bad parametrization": ({"model": {"parametrization": "ntk"}}, "model.parametrization", "'sp' or 'mup'"),
    "bad zero stage": ({"train": {"zero_stage": 5}}, "train.zero_stage", "0, 1, 2 or 3"),
    "unknown rule": ({"transfer": {"rule": "magic"}}, "", "transfer.rule='magic' is unknown"),
    "target narrower": ({"target": {"width": 16}}, "", "narrower than the widest"),
    "width not multiple of head_dim": (
        {"model": {"family": "llama", "head_dim": 16}, "sweep": {"widths": [24, 32]}},
        "",
        "not multiples of model.head_dim",
    ),
    "wrong type": ({"sweep": {"steps": "many"}}, "sweep.steps", "integer"),
    "missing target": ({"target": None}, "target", ""),
}


@pytest.mark.parametrize("case", BROKEN, ids=list(BROKEN))
def test_broken_spec_is_rejected_with_path_and_reason(case):
    over, path, words = BROKEN[case]
    d = tiny_spec_dict(**over)
    if d.get("target") is None:
        del d["target"]
    problems = _problems(d)
    assert any(p == path and words in m for p, m, _ in problems), problems


def test_all_errors_reported_at_once():
    d = tiny_spec_dict(sweep={"grid": {}, "widths": [8, 4]}, train={"zero_stage": 7}, model={"colour": "red"})
    paths = {p for p, _, _ in _problems(d)}
    assert {"sweep.grid", "sweep.widths", "train.zero_stage", "model.colour"} <= paths


@pytest.mark.slow  # three `hpt` processes: 5–6 s on 2 cores
def test_validate_cli_reports_and_exits_nonzero(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_spec_dict(sweep={"widths": [64, 32], "grid": {"lr": []}})))
    r = subprocess.run([sys.executable, "-m", "hptransfer", "validate", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    out = r.stdout + r.stderr
    assert "sweep.widths" in out and "[64, 32]" in out and "strictly increasing" in out
    assert "sweep.grid" in out
    good = subprocess.run(
        [sys.executable, "-m", "hptransfer", "validate", str(ROOT / "search_spaces/quickstart.yaml")],
        capture_output=True,
        text=True,
    )
    assert good.returncode == 0, good.stderr


def test_platform_module_is_not_shadowed():
    # platform/ is a source root, never a package: Python's own `platform` must still import.
    r = subprocess.run(
        [sys.executable, "-c", "import platform, hptransfer; print(platform.system())"], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0 and r.stdout.strip() == "Linux", r.stderr
    assert not (ROOT / "platform" / "__init__.py").exists()
