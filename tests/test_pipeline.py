"""`hpt run` end to end as a user runs it: a fresh process, a real local Ray, a Tune sweep, the
transfer, a 2-worker Ray Train + DeepSpeed run, MLflow on SQLite read back through the client."""

import json
import subprocess
import sys

import mlflow
import pytest
import yaml

from conftest import tiny_spec_dict

pytestmark = pytest.mark.slow


def test_hpt_run_end_to_end(tmp_path):
    spec = tiny_spec_dict(
        name="e2e",
        model={"family": "llama", "head_dim": 16, "seq_len": 16, "depth": 1},
        sweep={"widths": [16, 32], "grid": {"lr": [0.003, 0.03, 0.3]}},
        target={"width": 64, "steps": 4, "batch_size": 8},
    )
    path = tmp_path / "e2e.yaml"
    path.write_text(yaml.safe_dump(spec))
    study = tmp_path / "study"
    r = subprocess.run(
        [sys.executable, "-m", "hptransfer", "run", str(path), "--study-dir", str(study)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
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
    assert str(study / "transfer_plan.yaml") in r.stdout.replace("\n", "")

    plan = yaml.safe_load((study / "transfer_plan.yaml").read_text())
    assert plan["target"]["width"] == 64 and plan["rule"] == "mup"
    assert {int(w) for w in plan["diagnostics"]["optimum_by_width"]} == {16, 32}
    lr = plan["hyperparameters"]["lr"]
    assert 0.003 <= lr <= 0.3

    metrics = json.loads((study / "train/train_metrics.json").read_text())
    assert metrics["final"]["status"] == "ok" and metrics["final"]["step"] == 4
    assert len(metrics["history"]) == 4
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
    assert [m.step for m in hist] == [1, 2, 3, 4]  # rank 0 logs once per step; other ranks don't
