"""SIGTERM (preemption) outside the large run (issue 39, the last faults): the coordinate check and
the sweep stop at a boundary, exit 75 (errors.EXIT_RETRYABLE) with one line and no traceback, and
the same command continues: the sweep from Tune's saved state, its finished trials kept. Real `hpt`
processes, a real Ray started by each."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml

from conftest import tiny_spec_dict

pytestmark = pytest.mark.slow
LINE = re.compile(r"\[sweep \d+/\d+\] (?:replicate )?width=(\d+) lr=(\S+) seed=(\d+) -> (.*?) val_loss")


def _hpt(*args) -> list[str]:
    return [sys.executable, "-m", "hptransfer", *map(str, args)]


def test_sigterm_during_the_sweep_stops_it_with_exit_75_and_the_same_command_resumes(tmp_path):
    spec = tiny_spec_dict(name="sigterm", sweep={"widths": [16, 32], "grid": {"lr": [0.003, 0.01, 0.03]}, "steps": 80})
    spec_path = tmp_path / "sigterm.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    study = tmp_path / "study"
    cmd = _hpt("sweep", spec_path, "--study-dir", study)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    finished_before, out, deadline = set(), [], time.time() + 300
    for line in p.stdout:
        out.append(line)
        if m := LINE.search(line):
            finished_before.add(m.groups()[:3])
        if len(finished_before) >= 2 or time.time() > deadline:
            break
    p.send_signal(signal.SIGTERM)  # the driver alone, as the large run's preemption test does
    t = time.time()
    rest, _ = p.communicate(timeout=120)
    stop_s = time.time() - t
    text = "".join(out) + rest
    assert p.returncode == 75, text[-3000:]
    assert len(finished_before) >= 2, text[-3000:]
    assert "sweep: SIGTERM: stopping at the next boundary it can resume from" in text, text[-3000:]
    assert "the sweep stopped on SIGTERM; Tune's state is saved in" in text and "Traceback" not in text, text[-3000:]
    assert not (study / "sweep_results.csv").exists()  # no table from a part of the sweep
    print(f"SIGTERM to exit: {stop_s:.1f} s")

    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resuming the sweep" in r.stdout, r.stdout[-3000:]
    second = {m.groups()[:3]: m.group(4) for m in map(LINE.search, r.stdout.splitlines()) if m}
    for trial in finished_before:  # kept, not trained again
        assert trial not in second or "not run again" in second[trial], (trial, second.get(trial))
    df = pd.read_csv(study / "sweep_results.csv")
    assert len(df) == 6 and (df.status == "ok").all() and len(df.drop_duplicates(["width", "lr", "seed"])) == 6


def test_sigterm_during_the_coordinate_check_stops_the_run_with_exit_75(tmp_path):
    spec = tiny_spec_dict(name="sigterm-cc", coord_check={"widths": [16, 32, 64, 128], "steps": 3})
    spec_path = tmp_path / "cc.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    study = tmp_path / "study"
    p = subprocess.Popen(
        _hpt("run", spec_path, "--study-dir", study),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = []
    for line in p.stdout:
        out.append(line)
        if "coord check 1/4" in line:
            p.send_signal(signal.SIGTERM)
            break
    rest, _ = p.communicate(timeout=120)
    text = "".join(out) + rest
    assert p.returncode == 75, text[-3000:]
    stopped = r"the coordinate check stopped on SIGTERM (before width \d+'s model|after its last width)"
    assert re.search(stopped, text), text[-3000:]
    assert "Traceback" not in text and not (study / "coord_check.json").exists(), text[-3000:]
    assert not (study / "ray_results" / "sweep").exists()  # the sweep never started
