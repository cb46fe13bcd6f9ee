"""`hpt report`: a study folder built here from real parts (synthetic sweep table → `make_plan`, a
real coordinate check of a tiny MLP, a DP block priced by Opacus' accountant, a train_metrics.json
fixture) renders into one page whose figures exist and whose tables carry the plan's numbers; the
folder is logged to the study's MLflow sweep run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import yaml
from typer.testing import CliRunner

from hptransfer.io import sidecar
from hptransfer.plan import save_plan
from hptransfer.report import write_report
from hptransfer.spec import parse_spec
from hptransfer.transfer.engine import make_plan
from hptransfer.transfer.synthetic import synthetic_sweep

GRID = [float(x) for x in np.geomspace(1e-3, 1e-1, 9)]
TARGET_LOSS = 2.4567


def spec_dict(dp: bool = True) -> dict:
    d = {
        "name": "reportstudy",
        "model": {"family": "mlp", "depth": 2, "seq_len": 16, "parametrization": "mup"},
        "data": {"max_files": 40, "eval_batches": 2},
        "sweep": {"widths": [16, 32, 64], "grid": {"lr": GRID}, "steps": 20, "batch_size": 8},
        "coord_check": {"widths": [16, 32, 64], "steps": 2},
        "transfer": {"rule": "mup"},
        "target": {"width": 512},
    }
    if dp:
        d["dp"] = {
            "epsilon": 8.0,
            "delta": 1e-4,
            "dataset_size": 2_000,
            "epochs": 2,
            "accountant": "rdp",
            "batch_sizes": [100, 400],
            "min_steps": 5,
            "epsilon_tolerance": 0.2,
        }
    return d


def make_study(root: Path, *, drift: float | None = None, train: bool = True, coord: bool = True, dp: bool = True) -> Path:
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
        (study / "train" / "train_metrics.json").write_text(
            json.dumps(
                {"final": {"step": 20, "train_loss": 2.3, "val_loss": TARGET_LOSS, "wall_s": 12.0, "status": "ok"}, "history": []}
            )
        )
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
    (study / "coord_check.json").write_text(
        json.dumps(
            {
                "parametrization": "mup",
                "family": "mlp",
                "widths": [16, 32, 64],
                "steps": 2,
                "max_slope_allowed": 0.25,
                "slopes": {"hidden.0": 0.01},
                "worst_module": "hidden.0",
                "worst_slope": 0.0123,
                "passed": True,
            }
        )
    )


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
        assert f'<td class="l">{w}</td><td class="">{per["lr"]["value"]:.4g}</td>' in html
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
    text = " ".join(r.output.split())  # Rich wraps lines
    assert r.exit_code == 2 and "spec.yaml" in text and "nowhere" in text and "Traceback" not in text, text


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


HOSTILE = "<script>alert(1)</script>"
# `$...$` is matplotlib mathtext: an unknown command in a label fails the whole figure.
HOSTILE_TEX = HOSTILE + r"$\evil$"


def test_report_escapes_every_string_from_plan_and_coord_check(tmp_path):
    """Hand-edited or hostile study files: every string they carry reaches the page escaped, and the
    figures still draw. No sweep table, so the plan's primary hyperparameter need not be a column."""
    study = make_study(tmp_path, train=False, dp=False)
    (study / "sweep_results.csv").unlink()
    plan_path = study / "transfer_plan.yaml"
    plan = yaml.safe_load(plan_path.read_text())
    d = plan["diagnostics"]
    d["primary"] = HOSTILE_TEX
    d["optimum_by_width"] = {w: {HOSTILE_TEX: per["lr"]} for w, per in d["optimum_by_width"].items()}
    d["trials_by_width"] = {w: {HOSTILE: 1} for w in d["optimum_by_width"]}
    # Strings go where the typed diagnostics hold text (a string for a number is refused at load:
    # tests/test_transfer_plan_files.py).
    d["optimum_trend"] = {HOSTILE_TEX: {"slope": 0.1, "slope_se": 0.1}}
    d["warnings"], d["notes"] = [HOSTILE], [HOSTILE, HOSTILE]
    d["fast_transfer_test"], d["predicted_penalty_basis"] = HOSTILE, HOSTILE
    plan_path.write_text(yaml.safe_dump(plan))
    sidecar(plan_path).unlink()  # a hand edit that shortens the plan is accepted once its checksum file goes (io.torn)
    coord = json.loads((study / "coord_check.json").read_text())
    coord.update(steps=HOSTILE, worst_module=HOSTILE, widths=[HOSTILE], max_slope_allowed=HOSTILE)
    (study / "coord_check.json").write_text(json.dumps(coord))

    index = write_report(study)
    html = index.read_text()
    assert "<script" not in html.lower() and "alert(1)</" not in html
    escaped = "&lt;script&gt;alert(1)&lt;/script&gt;"
    # each hostile value is shown, escaped: header, two diagnostics rows, trials, warnings, notes,
    # test, coordinate check (steps, module, widths, allowed slope)
    assert html.count(escaped) >= 12, html.count(escaped)
    coord_box = html.split("<h2>Coordinate check</h2>")[1]
    assert f"{escaped} Adam steps" in coord_box and f"({escaped})" in coord_box
    assert (index.parent / "optimum_vs_width.png").stat().st_size > 5_000, "the figure drew the $-laden label"
