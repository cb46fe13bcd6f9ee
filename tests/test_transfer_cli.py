"""`hpt transfer` (study folder and standalone CSV/Parquet), bad tables, and `hpt export` validated by
DeepSpeed's and Hugging Face's own config classes."""

import json

import numpy as np
import pandas as pd
import pytest
import tomllib
import typer
import yaml
from typer.testing import CliRunner

from hptransfer.pipeline import transfer_stage
from hptransfer.plan import load_plan
from hptransfer.study import Study
from hptransfer.transfer import cli as transfer_cli
from hptransfer.transfer.exports import deepspeed_config, hf_training_args
from hptransfer.transfer.synthetic import synthetic_sweep

app = typer.Typer()
app.command("transfer")(transfer_cli.transfer)
app.command("export")(transfer_cli.export)
runner = CliRunner()

GRID = list(np.geomspace(1e-4, 1e-1, 13))


def sweep_table(widths=(32, 64, 128)) -> pd.DataFrame:
    df = synthetic_sweep(list(widths), GRID, nu_inf=3e-3, noise=0.003, seeds=(0, 1), diverge_above=lambda n: 3e-2)
    df["weight_decay"] = 0.1
    df["trial_id"] = [f"t{i}" for i in range(len(df))]  # extra columns are ignored
    df["wall_s"] = 1.0
    return df


def transfer_study(d):
    study = Study.from_dir(d)
    transfer_stage(study)
    return study.paths.plan


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_standalone_transfer_on_a_table(tmp_path, fmt):
    path = tmp_path / f"results.{fmt}"
    df = sweep_table()
    df.to_csv(path, index=False) if fmt == "csv" else df.to_parquet(path)
    out = tmp_path / "plan.yaml"
    r = run(
        "transfer",
        "--results",
        path,
        "--rule",
        "mup-independent-wd",
        "--target-width",
        1024,
        "--family",
        "mlp",
        "--target-batch-size",
        64,
        "--out",
        out,
    )
    assert r.exit_code == 0, r.output
    for text in (
        "optimum by width",
        "fast transfer",
        "predicted transfer penalty",
        "adam-batch-lr",
        "deepseek baseline lr",
        "plan written to",
    ):
        assert text in r.output
    plan = load_plan(out)
    assert plan.rule == "mup-independent-wd" and plan.target.width == 1024 and plan.target.batch_size == 64
    assert plan.hyperparameters["lr"] == pytest.approx(4**0.375 * 3e-3, rel=0.25)  # batch ×4 at fixed steps
    assert plan.hyperparameters["weight_decay"] == pytest.approx(0.1 / 4**0.375, rel=1e-9)  # η·λ held
    assert plan.diagnostics.fast_transfer == "undecided"  # 3 widths cannot decide it (issue 12)
    assert plan.param_group_multipliers["hidden_matrices"]["lr"] == pytest.approx(32 / 1024)
    assert plan.provenance["results_file_hash"]


def _write(tmp_path, df):
    p = tmp_path / "r.csv"
    df.to_csv(p, index=False)
    return p


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d.drop(columns=["status"]), "missing column(s) ['status']"),
        (lambda d: d.rename(columns={"lr": "learning_rate"}), "no hyperparameter column varies"),
        (lambda d: d[d["width"] == 32], "only one width"),
        (lambda d: d.assign(val_loss=np.nan), "no trial has status ok and a finite val_loss"),
        (lambda d: d.assign(status="done"), "unknown value(s) ['done']"),
        (lambda d: d.assign(width=d["width"] + 0.5), "column `width` must hold positive integers"),
    ],
)
def test_bad_tables_exit_2_with_a_clear_message(tmp_path, mutate, expected):
    r = run(
        "transfer",
        "--results",
        _write(tmp_path, mutate(sweep_table())),
        "--rule",
        "mup",
        "--target-width",
        512,
        "--family",
        "mlp",
    )
    assert r.exit_code == 2
    assert expected in r.output.replace("\n", " ")


def test_registered_in_hpt():
    from hptransfer.cli import app as hpt

    for cmd, flag in (("transfer", "--study-dir"), ("export", "--to")):
        r = runner.invoke(hpt, [cmd, "--help"])
        assert r.exit_code == 0 and flag in r.output


def test_bad_invocations_exit_2(tmp_path):
    p = _write(tmp_path, sweep_table())
    assert "unknown" in run("transfer", "--results", p, "--rule", "nope", "--target-width", 512).output
    r = run("transfer", "--results", p, "--rule", "mup")
    assert r.exit_code == 2 and "--target-width" in r.output
    assert run("transfer").exit_code == 2
    r = run("transfer", "--results", p, "--rule", "mup", "--target-width", 520)  # llama: 520 % 16 != 0
    assert r.exit_code == 2 and "head_dim" in r.output


def make_study(tmp_path, rule="mup"):
    d = tmp_path / "study"
    d.mkdir()
    spec = {
        "name": "quick",
        "model": {"family": "mlp", "parametrization": "sp" if rule == "sp-warmup" else "mup"},
        "sweep": {
            "widths": [32, 64, 128],
            "grid": {"lr": [float(v) for v in GRID]},
            "fixed": {"weight_decay": 0.1, "warmup_steps": 10},
            "steps": 100,
            "batch_size": 16,
            "seeds": [0, 1],
        },
        "transfer": {"rule": rule},
        "target": {"width": 512, "steps": 400},
    }
    (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    sweep_table().drop(columns=["weight_decay"]).to_csv(d / "sweep_results.csv", index=False)
    return d


def test_study_dir_mode_and_transfer_study(tmp_path):
    d = make_study(tmp_path, "sp-warmup")
    r = run("transfer", "--study-dir", d)
    assert r.exit_code == 0, r.output
    assert "sp-warmup: m=4" in r.output
    plan = load_plan(d / "transfer_plan.yaml")
    assert plan.hyperparameters["warmup_steps"] == 40  # 400/100 steps: warmup fraction kept
    assert plan.schedule["kind"] == "sp-warmup"
    before = (d / "transfer_plan.yaml").read_text()
    (d / "transfer_plan.yaml").unlink()
    path = transfer_study(d)
    assert path == d / "transfer_plan.yaml" and path.read_text() == before  # deterministic
    assert run("transfer", "--study-dir", d, "--rule", "mup").exit_code == 2


def test_transfer_stage_logs_the_plan_to_the_sweep_run(tmp_path):
    import mlflow

    d = make_study(tmp_path)
    study = Study.from_dir(d, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert transfer_study(d).is_file()  # no sweep run yet: nothing logged, no error
    parent = study.tracker("quick-sweep", kind="sweep")  # what `hpt sweep` leaves behind
    parent.end()
    transfer_stage(study)
    client = mlflow.MlflowClient(study.tracking_uri)
    got = client.get_run(parent.run_id)
    assert got.data.params["transfer_rule"] == "mup"
    assert "transfer_lr" in got.data.metrics
    assert [a.path for a in client.list_artifacts(parent.run_id)] == ["transfer_plan.yaml"]


def test_exports_pass_deepspeed_and_hf_validation(tmp_path):
    d = make_study(tmp_path)
    plan_path = transfer_study(d)
    plan = load_plan(plan_path)
    for to in ("deepspeed", "hf", "torchtitan"):
        r = run("export", plan_path, "--to", to)
        assert r.exit_code == 0, r.output
        assert "µP" in r.output  # the per-group multipliers a flat config cannot carry are printed
    ds = json.loads((d / "transfer_plan.deepspeed.json").read_text())
    from deepspeed.runtime.config import DeepSpeedConfig

    c = DeepSpeedConfig(ds)
    assert c.train_batch_size == plan.target.batch_size and c.zero_optimization_stage == plan.train.zero_stage
    assert ds["optimizer"]["params"]["lr"] == plan.hyperparameters["lr"]
    assert ds["scheduler"]["params"]["warmup_num_steps"] == 40 and ds["scheduler"]["params"]["total_num_steps"] == 400
    from transformers import TrainingArguments

    hf = TrainingArguments(**json.loads((d / "transfer_plan.hf_training_args.json").read_text()))
    assert hf.learning_rate == plan.hyperparameters["lr"] and hf.max_steps == 400 and hf.warmup_steps == 40
    assert hf.weight_decay == plan.hyperparameters["weight_decay"]
    tt = tomllib.loads((d / "transfer_plan.torchtitan.toml").read_text())
    assert tt["optimizer"]["lr"] == plan.hyperparameters["lr"] and tt["training"]["steps"] == 400


def test_export_refuses_what_the_framework_refuses(tmp_path):
    plan = load_plan(transfer_study(make_study(tmp_path)))
    plan.target.batch_size = 0  # DeepSpeed: train_batch_size must be > 0
    bad = tmp_path / "bad.yaml"
    from hptransfer.plan import save_plan

    save_plan(plan, bad)
    r = run("export", bad, "--to", "deepspeed")
    # refused when the plan is read now (batch_size ≥ 1), before DeepSpeed would refuse it
    assert r.exit_code == 2 and "target.batch_size" in r.output and "greater than or equal to 1" in r.output
    assert run("export", tmp_path / "none.yaml", "--to", "hf").exit_code == 2
    assert run("export", bad, "--to", "megatron").exit_code == 2
    assert deepspeed_config(plan)["train_batch_size"] == 0 and hf_training_args(plan)["max_steps"] == 400
