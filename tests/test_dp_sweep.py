"""DP sweeps over (ε, B, C, LR) on Ray Tune: every trial stays within its ε, B and C come from the
plan's reasoning, and the sweep is logged like any sweep."""

import mlflow
import pandas as pd
import pytest

from hptransfer.spec import parse_spec

from conftest import tiny_spec_dict

pytestmark = pytest.mark.slow


def test_dp_sweep_over_epsilon_batch_and_clip(ray_local, tmp_path):
    from hptransfer.dp.sweep import run_dp_sweep

    spec = parse_spec(
        tiny_spec_dict(
            name="dpsweep",
            dp={
                "epsilon": 1.0,
                "epochs": 2,
                "batch_sizes": [32, 128],
                "min_steps": 5,
                "accountant": "rdp",
                "clip_reference": 5.0,
                "clip_factors": [0.5, 2.0],
                "lr": 3e-3,
                "lr_reference_batch": 32,
            },
        )
    )
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    from hptransfer.study import Study

    df = run_dp_sweep(Study.from_spec(spec, tmp_path, tracking_uri=uri), epsilons=[1.0, 8.0])
    on_disk = pd.read_csv(tmp_path / "dp_sweep_results.csv")
    assert len(on_disk) == len(df) >= 2 * 2 * 2
    assert (on_disk.status == "ok").all()
    assert (on_disk.epsilon_spent <= on_disk.epsilon + 1e-9).all()  # private, every one
    assert set(on_disk.batch_size) == {32, 128} and set(on_disk.epsilon) == {1.0, 8.0}
    # the grid at ε=1 reaches higher C than at ε=8 (shifted upward as ε falls)
    assert on_disk[on_disk.epsilon == 1.0]["clip"].max() > on_disk[on_disk.epsilon == 8.0]["clip"].max()
    assert (on_disk.test_accuracy > 0.3).any()  # learned beyond chance (5 classes)
    assert (tmp_path / "dp_sweep.png").stat().st_size > 5000
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("dpsweep")
    kinds = [r.data.tags.get("hpt.kind") for r in client.search_runs([exp.experiment_id], max_results=1000)]
    assert kinds.count("dp-sweep") == 1 and kinds.count("dp-trial") == len(df)
