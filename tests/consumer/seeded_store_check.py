"""tests/test_mlflow_store.py's comparison, run in a fresh process: a seeded SQLite store is the store
MLflow makes itself (schema, rows, the Default experiment), and a working one. Usage: SCRIPT TMPDIR"""

import os
import sqlite3
import sys
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from hptransfer import tracking


def schema(db) -> list[tuple]:
    """Every table and index by name, and the migration revision. Not their CREATE text: SQLite keeps
    a migrated table's text as its ALTERs left it, which differed between two stores in one full
    slow-tier run. MLflow itself checks the revision when it opens a store."""
    con = sqlite3.connect(db)
    names = con.execute("SELECT type, name, tbl_name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchall()
    return sorted(names) + con.execute("SELECT version_num FROM alembic_version").fetchall()


tmp = Path(sys.argv[1]).resolve()
native, seeded = tmp / "native" / "mlflow.db", tmp / "seeded" / "mlflow.db"
native.parent.mkdir()
seeded.parent.mkdir()
# The cache is made (if not yet) before moving to the stores' folder: the Default experiment's artifact
# folder is relative to the working directory of the process that makes a store.
assert tracking._empty_store().name == f"mlflow-{mlflow.__version__}-empty.db"  # one per MLflow version
os.chdir(tmp)
made = MlflowClient(f"sqlite:///{native}").search_experiments()
assert tracking.seed_sqlite_store(f"sqlite:///{seeded}")
c = tracking.client(f"sqlite:///{seeded}")
got = c.search_experiments()
key = lambda e: (e.experiment_id, e.name, e.artifact_location, e.lifecycle_stage, e.workspace)
want = [("0", "Default", str(tmp / "mlruns" / "0"), "active", "default")]
assert [key(e) for e in got] == [key(e) for e in made] == want, ([key(e) for e in got], [key(e) for e in made])
assert got[0].creation_time >= made[0].creation_time  # made when opened, not when the cache was
assert schema(seeded) == schema(native)
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
print("ok")
