"""A new SQLite tracking store starts as a copy of MLflow's own empty, migrated store
(`tracking.seed_sqlite_store`): the same schema and the same Default experiment as a store MLflow
makes itself, without its ~50 migrations per study. Only a store not yet made is touched."""

from __future__ import annotations

import pytest

from hptransfer import tracking


@pytest.mark.slow  # MLflow makes a store the slow way here, to compare (4-17 s)
def test_a_seeded_store_is_the_store_mlflow_makes(tmp_path):
    """In a fresh process: MLflow keeps process-wide state (cached stores, tracking settings) that
    tests before this one change, and the comparison is about a new process's first store."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("consumer") / "seeded_store_check.py"
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0 and "ok" in r.stdout, (r.stdout + r.stderr)[-4000:]


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
