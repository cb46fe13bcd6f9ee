"""Coordinate check on the Llama family: µP keeps activation sizes flat in width, SP does not."""

import json
import subprocess
import sys

import pytest
import yaml

from hptransfer.coordcheck import coord_check
from hptransfer.spec import parse_spec
from hptransfer.study import Study

from conftest import tiny_spec_dict

pytestmark = pytest.mark.slow  # Llama at widths to 256 and an `hpt coord-check` process: ~15 s on 2 cores


def _llama(par):
    return parse_spec(
        tiny_spec_dict(
            model={"family": "llama", "parametrization": par, "head_dim": 16, "seq_len": 32, "depth": 2},
            sweep={"widths": [32, 64, 128, 256]},
            target={"width": 256},
        )
    )


@pytest.mark.parametrize("par,passes", [("mup", True), ("sp", False)])
def test_coord_check_llama(par, passes, tmp_path):
    r = coord_check(Study.from_spec(_llama(par), tmp_path))
    assert r.passed is passes, r.slopes
    if passes:
        assert max(r.slopes.values()) < 0.25
    else:
        # SP's readout output grows roughly ∝ width after a few Adam steps
        assert r.slopes["lm_head"] > 0.6
    data = json.loads((tmp_path / "coord_check.json").read_text())
    assert data["passed"] is passes and {rec["width"] for rec in data["records"]} == {32, 64, 128, 256}
    assert (tmp_path / "coord_check.png").stat().st_size > 10_000


def test_coord_check_cli_exit_code(tmp_path):
    spec = tmp_path / "sp.yaml"
    d = tiny_spec_dict(model={"parametrization": "sp"}, sweep={"widths": [16, 64]})
    spec.write_text(yaml.safe_dump(d))
    r = subprocess.run(
        [sys.executable, "-m", "hptransfer", "coord-check", str(spec), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL" in r.stdout and (tmp_path / "out" / "coord_check.png").exists()
