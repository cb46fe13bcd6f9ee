"""A new SQLite tracking store starts as a copy of MLflow's own empty, migrated store
(`tracking.seed_sqlite_store`): the same schema and the same Default experiment as a store MLflow
makes itself, without its ~50 migrations per study. Only a store not yet made is touched."""

from __future__ import annotations

import sqlite3

import mlflow
import pytest
from mlflow import MlflowClient

from hptransfer import tracking


def _schema(db) -> list[str]:
    """Every table, index and row but the Default experiment's (its time differs), sorted: MLflow
    creates the indexes in an order that differs from one process to the next."""
    return sorted(line for line in sqlite3.connect(db).iterdump() if not line.startswith('INSERT INTO "experiments"'))


@pytest.mark.slow  # MLflow makes a store the slow way here, to compare (4-17 s)
def test_a_seeded_store_is_the_store_mlflow_makes(tmp_path, monkeypatch):
    native, seeded = tmp_path / "native" / "mlflow.db", tmp_path / "seeded" / "mlflow.db"
    native.parent.mkdir()
    seeded.parent.mkdir()
    # The cache is made (if not yet) in another working directory than the stores: the Default
    # experiment's artifact folder is relative to the working directory of the process that makes it.
    assert tracking._empty_store().name == f"mlflow-{mlflow.__version__}-empty.db"  # one per MLflow version
    monkeypatch.chdir(tmp_path)
    made = MlflowClient(f"sqlite:///{native}").search_experiments()
    assert tracking.seed_sqlite_store(f"sqlite:///{seeded}")
    c = tracking.client(f"sqlite:///{seeded}")
    got = c.search_experiments()
    key = lambda e: (e.experiment_id, e.name, e.artifact_location, e.lifecycle_stage, e.workspace)
    assert (
        [key(e) for e in got] == [key(e) for e in made] == [("0", "Default", str(tmp_path / "mlruns" / "0"), "active", "default")]
    )
    assert got[0].creation_time >= made[0].creation_time  # made when opened, not when the cache was
    assert _schema(seeded) == _schema(native)
    # and it is a working store: a run written through the project's tracker reads back
    t = tracking.MlflowTracker(f"sqlite:///{seeded}", "exp", run_name="r", tags={"hpt.kind": "train"})
    t.log_metrics({"loss": 1.5}, step=3)
    t.end()
    run = c.get_run(t.run_id)
    assert run.data.metrics == {"loss": 1.5} and run.data.tags["hpt.kind"] == "train" and run.info.status == "FINISHED"
    before = seeded.read_bytes()
    assert not tracking.seed_sqlite_store(f"sqlite:///{seeded}")  # an existing store is never replaced
    assert seeded.read_bytes() == before
    assert not list(seeded.parent.glob(".*.tmp"))


def test_only_a_new_sqlite_file_in_an_existing_folder_is_seeded(tmp_path):
    for uri in (
        "http://127.0.0.1:5000",
        "sqlite://",  # in memory
        f"sqlite:///{tmp_path / 'x.db'}?timeout=30",  # options: left to MLflow
        f"sqlite:///{tmp_path / 'missing' / 'mlflow.db'}",  # no folder: MLflow's own error
        f"file://{tmp_path / 'mlruns'}",
    ):
        assert not tracking.seed_sqlite_store(uri), uri
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_cache_that_cannot_be_made_leaves_the_store_to_mlflow(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(tracking, "STORE_CACHE", blocker / "hpt_cache")  # its folder cannot be made
    assert not tracking.seed_sqlite_store(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # no store, no temporary file
