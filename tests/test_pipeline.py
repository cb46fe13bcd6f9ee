"""`hpt run` end to end as a user runs it: a fresh process, a real local Ray, a Tune sweep, the
transfer, a 2-worker Ray Train + DeepSpeed run, MLflow on SQLite read back through the client. The
run is the session's shared one (`hpt_run_study` in conftest.py; test_console.py reads its console)."""

import json
import math

import mlflow
import pandas as pd
import pytest
import yaml

from conftest import E2E_STEPS

pytestmark = pytest.mark.slow


def test_hpt_run_end_to_end(hpt_run_study):
    study = hpt_run_study["dir"]
    for name in (
        "spec.yaml",
        "coord_check.png",
        "sweep_results.csv",
        "sweep.png",
        "transfer_plan.yaml",
        "train/train_metrics.json",
        "train/deepspeed_config.json",
        "train/hf_model/config.json",
        "mlflow.db",
        "report/index.html",
    ):
        assert (study / name).exists(), name
    assert str(study / "transfer_plan.yaml") in hpt_run_study["stdout"].replace("\n", "")

    plan = yaml.safe_load((study / "transfer_plan.yaml").read_text())
    assert plan["target"]["width"] == 64 and plan["target"]["steps"] == E2E_STEPS and plan["rule"] == "mup"
    assert {int(w) for w in plan["diagnostics"]["optimum_by_width"]} == {16, 32}
    lr = plan["hyperparameters"]["lr"]
    # µTransfer takes the widest swept width's optimum as is (times any lr heuristic for the target's
    # batch/steps), and that optimum is the fit around the best grid point the sweep measured: read
    # here from sweep_results.csv, not from the plan.
    table = pd.read_csv(study / "sweep_results.csv")
    wide = table[(table.width == 32) & (table.status == "ok")].groupby("lr")["val_loss"].mean()
    fit = plan["diagnostics"]["optimum_by_width"]["32"]["lr"]
    assert fit["best_grid_value"] == pytest.approx(wide.idxmin(), rel=1e-12)
    assert fit["best_loss"] == pytest.approx(wide.min(), rel=1e-9)
    grid_step = math.log(10)  # the grid 0.003, 0.03, 0.3
    assert abs(math.log(fit["value"] / wide.idxmin())) <= grid_step + 1e-9
    factor = math.prod(h["factor"] for h in plan["heuristics"] if h["applies_to"] == "lr")
    assert lr == pytest.approx(fit["value"] * factor, rel=1e-9)

    metrics = json.loads((study / "train/train_metrics.json").read_text())
    assert metrics["final"]["status"] == "ok" and metrics["final"]["step"] == E2E_STEPS
    assert len(metrics["history"]) == E2E_STEPS
    assert metrics["deepspeed_config"]["train_micro_batch_size_per_gpu"] == 4  # 8 sequences over 2 ranks
    # the final DeepSpeed checkpoint, persisted by Ray Train: model states plus one optimizer shard per rank
    ckpts = [p.name for p in (study / "train/ray_results/train").glob("checkpoint_*/state/*")]
    assert sum("optim_states" in n for n in ckpts) == 2 and any("model_states" in n for n in ckpts), ckpts

    mlflow.set_tracking_uri(f"sqlite:///{study / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["e2e"])
    kinds = runs["tags.hpt.kind"].value_counts().to_dict()
    assert kinds == {"sweep": 1, "trial": 6, "train": 1}
    train = runs[runs["tags.hpt.kind"] == "train"].iloc[0]
    assert float(train["params.hp.lr"]) == pytest.approx(lr)
    hist = mlflow.MlflowClient().get_metric_history(train.run_id, "train_loss")
    assert [m.step for m in hist] == list(range(1, E2E_STEPS + 1))  # rank 0 logs once per step; other ranks don't
