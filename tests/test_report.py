"""`hpt report`: a study folder built here from real parts (synthetic sweep table → `make_plan`, a
real coordinate check of a tiny MLP, a DP block priced by Opacus' accountant, a train_metrics.json
fixture) renders into one page whose figures exist and whose tables carry the plan's numbers; the
folder is logged to the study's MLflow sweep run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from hptransfer.report import write_report
from hptransfer.spec import parse_spec
from hptransfer.transfer.engine import make_plan
from hptransfer.transfer.plan import save_plan
from hptransfer.transfer.synthetic import synthetic_sweep

GRID = [float(x) for x in np.geomspace(1e-3, 1e-1, 9)]
TARGET_LOSS = 2.4567


def spec_dict(dp: bool = True) -> dict:
    d = {"name": "reportstudy",
         "model": {"family": "mlp", "depth": 2, "seq_len": 16, "parametrization": "mup"},
         "data": {"max_files": 40, "eval_batches": 2},
         "sweep": {"widths": [16, 32, 64], "grid": {"lr": GRID}, "steps": 20, "batch_size": 8},
         "coord_check": {"widths": [16, 32, 64], "steps": 2},
         "transfer": {"rule": "mup"},
         "target": {"width": 512}}
    if dp:
        d["dp"] = {"epsilon": 8.0, "delta": 1e-4, "dataset_size": 2_000, "epochs": 2, "accountant": "rdp",
                   "batch_sizes": [100, 400], "min_steps": 5, "epsilon_tolerance": 0.2}
    return d


def make_study(root: Path, *, drift: float | None = None, train: bool = True, coord: bool = True,
               dp: bool = True) -> Path:
    """A study folder as the pipeline leaves it. drift: power of ν*(n) ∝ n^drift (None: invariant)."""
    study = root / "study"
    study.mkdir()
    d = spec_dict(dp)
    (study / "spec.yaml").write_text(yaml.safe_dump(d))
    spec = parse_spec(d)
    df = synthetic_sweep(spec.sweep.widths, GRID, nu_inf=1e-2, power=drift, n0=16, noise=0.002, seeds=(0, 1))
    df.to_csv(study / "sweep_results.csv", index=False)
    save_plan(make_plan(spec, df), study / "transfer_plan.yaml")
    if coord:
        write_coord_check(study)
    if train:
        (study / "train").mkdir()
        (study / "train" / "train_metrics.json").write_text(json.dumps(
            {"final": {"step": 20, "train_loss": 2.3, "val_loss": TARGET_LOSS, "wall_s": 12.0, "status": "ok"},
             "history": []}))
    return study


def write_coord_check(study: Path) -> None:
    """coord_check.{json,png} with CoordCheckResult's fields. A fixture, not `coord_check()`: the real
    check trains three models (tens of seconds on a busy 2-core box) and has its own tests; the
    report only copies the PNG and reads these fields."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hptransfer.io import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([16, 32, 64], [1.0, 1.02, 0.99], "o-")
    save_figure(fig, study / "coord_check.png")
    (study / "coord_check.json").write_text(json.dumps({
        "parametrization": "mup", "family": "mlp", "widths": [16, 32, 64], "steps": 2, "max_slope_allowed": 0.25,
        "slopes": {"hidden.0": 0.01}, "worst_module": "hidden.0", "worst_slope": 0.0123, "passed": True}))


def images(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]+)"', html)


def test_report_has_every_section_and_its_figures(tmp_path):
    study = make_study(tmp_path)
    index = write_report(study)
    assert index == study / "report" / "index.html"
    html = index.read_text()
    imgs = images(html)
    assert set(imgs) == {"transfer.png", "optimum_vs_width.png", "coord_check.png"}
    for name in imgs:  # relative paths inside report/: the folder stands alone
        png = index.parent / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    plan = yaml.safe_load((study / "transfer_plan.yaml").read_text())
    assert f"{plan['hyperparameters']['lr']:.4g}" in html  # the transferred LR
    assert f"{TARGET_LOSS:.4g}" in html  # the target run's measured loss
    for w, per in plan["diagnostics"]["optimum_by_width"].items():  # one row per swept width
        assert f"<td class=\"l\">{w}</td><td class=\"\">{per['lr']['value']:.4g}</td>" in html
    assert "Coordinate check" in html and "passed: the steepest growth" in html and "0.012" in html
    # DP table: one row per batch size, the chosen one highlighted, σ√T from Opacus' RDP accountant.
    from hptransfer.dp.plan import dp_plan_for

    dpp = dp_plan_for(parse_spec(spec_dict()).dp)
    assert len(re.findall(r"<tr(?: class=\"chosen\")?><td class=\"l\">(100|400)</td>", html)) == 2
    assert re.search(rf'<tr class="chosen"><td class="l">{dpp.batch_size}</td>', html)
    for row in dpp.table:
        assert f"{row.sigma_sqrt_t:.4g}" in html
    assert "<script" not in html and "http" not in html.split("</style>")[1]  # nothing fetched from outside


def test_drifting_optimum_is_flagged_in_the_report(tmp_path):
    """ν* ∝ n^-0.5 under rule `mup`: the diagnostics warn, and the page shows the warning."""
    study = make_study(tmp_path, drift=-0.5, coord=False, dp=False)
    html = write_report(study).read_text()
    warns = yaml.safe_load((study / "transfer_plan.yaml").read_text())["diagnostics"]["warnings"]
    assert any("drifts with width" in w for w in warns)
    box = html.split("<h2>Warnings</h2>")[1].split("<h2>")[0]
    assert 'class="warn"' in box and "drifts with width" in box
    assert "DP noise" not in html  # no dp: block, no DP section


def test_missing_stages_say_which_command_makes_them(tmp_path):
    study = make_study(tmp_path, train=False, coord=False, dp=False)
    (study / "transfer_plan.yaml").unlink()
    html = write_report(study).read_text()
    assert images(html) == ["transfer.png"]
    for cmd in ("hpt transfer --study-dir STUDY_DIR", "hpt coord-check SPEC"):
        assert cmd in html


def test_cli_writes_the_report_and_rejects_a_non_study(tmp_path):
    from hptransfer.cli import app

    study = make_study(tmp_path, coord=False, dp=False)
    runner = CliRunner()
    r = runner.invoke(app, ["report", str(study)])
    assert r.exit_code == 0, r.output
    assert (study / "report" / "index.html").is_file() and "file://" in r.output
    r = runner.invoke(app, ["report", str(tmp_path / "nowhere")])
    assert r.exit_code == 2 and "spec.yaml is missing" in " ".join(r.output.split())  # Rich wraps lines


@pytest.mark.slow
def test_report_is_logged_to_the_sweep_parent_run(tmp_path):
    from mlflow import MlflowClient

    from hptransfer.tracking import TAG_KIND, TAG_STUDY, MlflowTracker

    study = make_study(tmp_path, coord=False, dp=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    parent = MlflowTracker(uri, "reportstudy", run_name="sweep", tags={TAG_STUDY: str(study.resolve()), TAG_KIND: "sweep"})
    other = MlflowTracker(uri, "reportstudy", run_name="other", tags={TAG_STUDY: "/elsewhere", TAG_KIND: "sweep"})
    write_report(study, uri)
    client = MlflowClient(uri)
    logged = {Path(a.path).name for a in client.list_artifacts(parent.run_id, "report")}
    assert logged == {"index.html", "transfer.png", "optimum_vs_width.png"}
    assert client.list_artifacts(other.run_id) == []
