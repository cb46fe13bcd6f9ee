"""MLflow at the edges, through one idiom. The core of tracking: it imports nothing of hptransfer,
so any layer can hold a tracker.

- `Tracker`, the protocol every stage writes through; its backends: `MlflowTracker` (MLflow's
  client, no global active-run state; made by `StudyContext.tracker`) and `NullTracker`, so training
  code never branches on rank or on whether tracking is on;
- `BatchedMetrics`, per-step metrics written in batches (the large run's rank 0);
- `Spooled`, a tracker that never sinks training: what MLflow does not take (server down) is
  appended to a file in the study folder and delivered, in order, by the next write that succeeds
  or by `replay_unsent` (`hpt status --replay-mlflow`);
- `find_study_run`, a study's run of one kind (its sweep parent run), found by tags.
- `client`, MLflow's client for a tracking URI; a new SQLite store starts as a copy of an empty,
  already-migrated one (`seed_sqlite_store`), not MLflow's ~50 schema migrations (4-17 s on 2 cores).

The parent/child logger every sweep uses is the sweep stage's (`hptransfer.sweep.record.log_sweep_runs`)."""

from __future__ import annotations

import math
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable

TAG_STUDY = "hpt.study_dir"
TAG_KIND = "hpt.kind"
TAG_TRIAL = "hpt.trial_id"
MAX_METRICS_PER_BATCH = 1000  # MLflow's limit on one log_batch

MetricRow = tuple[dict[str, Any], int, int]  # (metrics, step, timestamp in ms)


@runtime_checkable
class Tracker(Protocol):
    """One tracked run: what the stages write (parameters, metrics by step, files, tags)."""

    run_id: str | None

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None: ...

    def log_metric_rows(self, rows: list[MetricRow]) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def set_tags(self, tags: dict[str, Any]) -> None: ...

    def end(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    """Records nothing: what ranks other than 0, and runs without tracking, write to."""

    run_id = None

    def log_params(self, params):
        pass

    def log_metrics(self, metrics, step=None):
        pass

    def log_metric_rows(self, rows):
        pass

    def log_artifact(self, path, artifact_path=None):
        pass

    def set_tags(self, tags):
        pass

    def end(self, status="FINISHED"):
        pass


def client(tracking_uri: str):
    """MLflow's client for `tracking_uri`; a SQLite store not yet made is seeded first (below)."""
    from mlflow import MlflowClient

    seed_sqlite_store(tracking_uri)
    return MlflowClient(tracking_uri)


# A new SQLite store: MLflow creates its tables and then runs every schema migration (~50 in 3.x:
# 4-17 s on 2 cores, paid by every new study). The same file, made once per MLflow version and
# kept beside the interpreter (as hptransfer.env keeps DeepSpeed's built ops), is copied instead.
# It is MLflow's own empty store with its one row of data, the "Default" experiment, removed: that
# row holds the creating process's working directory and time, and MLflow recreates it, as for any
# store, when it opens one without it. MLflow still checks the copy's schema revision on opening.
STORE_CACHE = Path(sys.prefix) / "hpt_cache"


def seed_sqlite_store(tracking_uri: str) -> bool:
    """Put an empty, migrated MLflow store at a `sqlite:///PATH` URI whose file does not exist yet
    (its folder does); True when it did. Any other URI, an existing file, or a cache that cannot be
    written leaves the store to MLflow, as without this."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix) or "?" in tracking_uri:
        return False
    dest = Path(tracking_uri[len(prefix) :])
    if not dest.name or dest.exists() or not dest.parent.is_dir():
        return False
    try:
        template = _empty_store()
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        shutil.copyfile(template, tmp)
        try:
            os.link(tmp, dest)  # atomic, and never over a store another process made meanwhile
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
    except Exception:  # a cache that cannot be made or copied here: MLflow makes the store, as without it
        return False
    return True


def _empty_store() -> Path:
    """The cached empty store for the installed MLflow, made on first use (atomically)."""
    import mlflow
    from mlflow import MlflowClient

    path = STORE_CACHE / f"mlflow-{mlflow.__version__}-empty.db"
    if path.is_file():
        return path
    STORE_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = STORE_CACHE / f".build-{os.getpid()}-{time.time_ns()}.db"
    try:
        MlflowClient(f"sqlite:///{tmp}").search_experiments()  # creates and migrates it
        con = sqlite3.connect(tmp)
        try:
            with con:
                con.execute("DELETE FROM experiments")
        finally:
            con.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class MlflowTracker:
    """One MLflow run, used through the client (no global active-run state across processes)."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        run_name: str | None = None,
        tags: dict[str, Any] | None = None,
        parent_run_id: str | None = None,
        run_id: str | None = None,
    ):
        self.client = client(tracking_uri)
        if run_id:
            self.run_id = run_id
            return
        exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(experiment)
        tags = {k: str(v) for k, v in (tags or {}).items()}
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        self.run_id = self.client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id

    def log_params(self, params):
        from mlflow.entities import Param

        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    def log_metrics(self, metrics, step=None):
        self.log_metric_rows([(metrics, step or 0, int(time.time() * 1000))])

    def log_metric_rows(self, rows: list[MetricRow]):
        """Many steps' metrics in as few `log_batch` calls as MLflow allows (finite numbers only)."""
        from mlflow.entities import Metric

        ms = [
            Metric(k, float(v), ts, step or 0)
            for metrics, step, ts in rows
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and math.isfinite(float(v))
        ]
        for i in range(0, len(ms), MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=ms[i : i + MAX_METRICS_PER_BATCH])

    def log_artifact(self, path, artifact_path=None):
        if Path(path).is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path or Path(path).name)
        else:
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags):
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def end(self, status="FINISHED"):
        self.client.set_terminated(self.run_id, status)


class BatchedMetrics:
    """A tracker whose `log_metrics` is buffered and written in one call once `every_steps` calls are
    buffered or the oldest is `every_s` seconds old (whichever is set and comes first), and on
    `flush()`; each value keeps its own step and the time it was measured. Everything else goes
    straight through. `seconds`, `writes` and `first_s` (the first write, which opens the store) say
    what writing cost (benchmarks/train_throughput.py --mlflow).

    Why by time: a write to MLflow's SQLite store costs ~30 ms plus ~1 ms per step it carries
    (measured on 2 cores), so the number of writes is what costs, and writing at most every
    `every_s` seconds bounds that cost to a fixed fraction of the run whatever a step takes."""

    def __init__(self, tracker, every_steps: int | None = None, every_s: float | None = None):
        self.tracker, self.every_steps, self.every_s = tracker, every_steps, every_s
        self.rows: list[MetricRow] = []
        self.seconds, self.writes, self.first_s = 0.0, 0, 0.0
        self._since = 0.0

    def __getattr__(self, name: str):
        return getattr(self.tracker, name)

    def log_metrics(self, metrics, step=None):
        now = time.time()
        if not self.rows:
            self._since = now
        self.rows.append((dict(metrics), step or 0, int(now * 1000)))
        if (self.every_steps and len(self.rows) >= self.every_steps) or (
            self.every_s is not None and now - self._since >= self.every_s
        ):
            self.flush()

    def flush(self) -> None:
        if self.rows:
            t = time.perf_counter()
            rows, self.rows = self.rows, []
            self.tracker.log_metric_rows(rows)
            dt = time.perf_counter() - t
            self.seconds, self.writes = self.seconds + dt, self.writes + 1
            self.first_s = self.first_s or dt


def find_study_run(tracking_uri: str, experiment: str, study_root: str | Path, kind: str) -> str | None:
    """The run id of the study's run of `kind` (tags `hpt.study_dir`, `hpt.kind`), or None."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    if not exp:
        return None
    runs = c.search_runs(
        [exp.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = '{study_root}' and tags.`{TAG_KIND}` = '{kind}'"
    )
    return runs[0].info.run_id if runs else None


# --- MLflow down: keep what was not logged, deliver it later ---------------------------------------


def mlflow_or_later(study: Any, what: str, write, log=print):
    """`write()`, a stage's MLflow record made from files already on disk (the sweep's parent and
    children from its table, the plan): MLflow unreachable, one line and None instead of a failed
    stage. Nothing is lost: both records are idempotent and made again, from the same files, by the
    same command once MLflow answers (`hpt run` / `hpt sweep` resume at once, then log)."""
    fail_quickly()  # seconds, not MLflow's minutes of retries, before saying so
    try:
        return write()
    except Exception as e:
        if not _unreachable(e):
            raise
        log(
            f"MLflow: unreachable at {study.tracking_uri} ({type(e).__name__}): {what} not logged; they are in "
            f"{study.root} and are logged when the same command runs again with MLflow up"
        )
        return None


def _unreachable(e: BaseException) -> bool:
    """An MLflow server that does not answer (connection refused, timeouts, retries exhausted, 5xx)."""
    import requests
    from mlflow.exceptions import MlflowException

    text = f"{type(e).__name__}: {e}"
    if isinstance(e, (requests.exceptions.ConnectionError, requests.exceptions.Timeout, ConnectionError, TimeoutError)):
        return True
    return isinstance(e, MlflowException) and any(
        s in text for s in ("Max retries exceeded", "Connection refused", "API request to", "timed out", "503", "502")
    )


# A worker's write to a server that is down must fail in seconds, not after MLflow's default
# retries (7, backoff ×2: minutes of a blocked training step); the caller spools what failed.
QUICK_FAIL_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def fail_quickly() -> None:
    """Set QUICK_FAIL_ENV in this process (a value the user set is kept)."""
    import os

    for k, v in QUICK_FAIL_ENV.items():
        os.environ.setdefault(k, v)


class Spooled:
    """`tracker` whose writes that fail (MLflow unreachable) go, in order, to `spool` (JSON lines)
    instead of raising; the next call first delivers what is spooled, so a server back up gets
    everything in the order it was logged. The driver and rank 0 share one spool (one line per
    operation, appended whole); they write at different times (before, during, after Ray Train)."""

    def __init__(self, tracker, spool: str | Path, tracking_uri: str):
        self.tracker, self.spool, self.tracking_uri = tracker, Path(spool), tracking_uri
        self.run_id = tracker.run_id
        self.failures = 0

    @classmethod
    def pending(cls, spool: str | Path, tracking_uri: str, experiment: str, run_name: str, tags: dict[str, Any]) -> Self:
        """MLflow is down as the run starts: a run id of our own (`pending-…`) whose first spooled
        op creates the MLflow run once the server answers; every later op follows it there."""
        import uuid

        tracker = MlflowTracker(tracking_uri, experiment, run_id=f"{PENDING}{uuid.uuid4().hex}")
        self = cls(tracker, spool, tracking_uri)
        self._keep(
            {
                "run_id": self.run_id,
                "op": "create",
                "experiment": experiment,
                "run_name": run_name,
                "tags": {k: str(v) for k, v in tags.items()},
            },
            "MLflow unreachable when the run started",
        )
        return self

    def _call(self, op: dict) -> None:
        op = {"run_id": self.run_id, **op}
        if self.spool.exists() and not replay_unsent(self.spool, self.tracking_uri):
            self._keep(op, "an earlier write is still waiting")
            return
        try:
            _apply(self.tracker.client, op, self.spool)
        except Exception as e:
            self._keep(op, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")

    def _keep(self, op: dict, why: str) -> None:
        import json

        self.failures += 1
        self.spool.parent.mkdir(parents=True, exist_ok=True)
        with self.spool.open("a", encoding="utf-8") as f:
            f.write(json.dumps({**op, "why": why}, default=str) + "\n")

    def log_params(self, params):
        self._call({"op": "params", "params": {k: str(v)[:6000] for k, v in params.items()}})

    def log_metrics(self, metrics, step=None):
        self.log_metric_rows([(metrics, step or 0, int(time.time() * 1000))])

    def log_metric_rows(self, rows):
        rows = [
            ({k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and math.isfinite(float(v))}, st, ts)
            for m, st, ts in rows
        ]
        self._call({"op": "metrics", "rows": rows})

    def log_artifact(self, path, artifact_path=None):
        self._call({"op": "artifact", "path": str(Path(path).resolve()), "artifact_path": artifact_path})

    def set_tags(self, tags):
        self._call({"op": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def end(self, status="FINISHED"):
        self._call({"op": "end", "status": status})


PENDING = "pending-"  # a run id made while MLflow was down: its `create` op makes the real run later


def ids_file(spool: str | Path) -> Path:
    """Where a spool keeps pending id → real MLflow run id, once its `create` op was delivered."""
    return Path(spool).with_suffix(".ids.json")


def real_run_id(spool: str | Path, run_id: str) -> str | None:
    """The MLflow run id a pending one became (None while it is still pending); a real id as is."""
    if not run_id.startswith(PENDING):
        return run_id
    import json

    try:
        return json.loads(ids_file(spool).read_text()).get(run_id)
    except (OSError, ValueError):
        return None


def _apply(client, op: dict, spool: str | Path | None = None) -> None:
    """One spooled operation, through the MLflow client (raises when the server is unreachable). A
    `create` op makes the run a pending id stands for (and records the pair beside the spool); the
    other ops of a pending id go to that run."""
    from mlflow.entities import Metric, Param, RunTag

    run_id, kind = op["run_id"], op["op"]
    if kind == "create":
        if spool is not None and real_run_id(spool, run_id):
            return  # delivered before a crash cut the spool's rewrite short: not twice
        exp = client.get_experiment_by_name(op["experiment"])
        exp_id = exp.experiment_id if exp else client.create_experiment(op["experiment"])
        real = client.create_run(exp_id, run_name=op.get("run_name"), tags=op.get("tags") or {}).info.run_id
        if spool is not None:
            import json

            from hptransfer.io import write_atomic

            path = ids_file(spool)
            known = json.loads(path.read_text()) if path.exists() else {}
            write_atomic(path, json.dumps({**known, run_id: real}))
        return
    if run_id.startswith(PENDING):
        real = real_run_id(spool, run_id) if spool is not None else None
        if real is None:
            raise RuntimeError(f"run {run_id} has not been created in MLflow yet")
        run_id = real
    if kind == "metrics":
        ms = [Metric(k, v, ts, step) for metrics, step, ts in op["rows"] for k, v in metrics.items()]
        for i in range(0, len(ms), MAX_METRICS_PER_BATCH):
            client.log_batch(run_id, metrics=ms[i : i + MAX_METRICS_PER_BATCH])
    elif kind == "params":
        client.log_batch(run_id, params=[Param(k, v) for k, v in op["params"].items()])
    elif kind == "tags":
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in op["tags"].items()])
    elif kind == "artifact":
        path = Path(op["path"])
        if path.is_dir():
            client.log_artifacts(run_id, str(path), op.get("artifact_path") or path.name)
        elif path.exists():
            client.log_artifact(run_id, str(path), op.get("artifact_path"))
    elif kind == "end":
        client.set_terminated(run_id, op["status"])


def read_unsent(spool: str | Path) -> list[dict]:
    """The spooled operations, oldest first (a line cut short by a crash is dropped)."""
    import json

    out = []
    try:
        lines = Path(spool).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def describe_unsent(ops: list[dict]) -> str:
    """ "12 metric rows (steps 3-10), 1 artifact, the run's end (FINISHED) of run abc…"."""
    rows = [r for op in ops if op.get("op") == "metrics" for r in op["rows"]]
    steps = sorted({int(r[1]) for r in rows})
    parts = [f"{len(rows)} metric rows" + (f" (steps {steps[0]}-{steps[-1]})" if steps else "")] if rows else []
    for kind, name in (("params", "parameter batch"), ("tags", "tag batch"), ("artifact", "artifact")):
        n = sum(op.get("op") == kind for op in ops)
        if n:
            parts.append(f"{n} {name}{'es' if n > 1 and name.endswith('batch') else 's' if n > 1 else ''}")
    if any(op.get("op") == "create" for op in ops):
        parts.insert(0, "the run's creation")
    ends = [op["status"] for op in ops if op.get("op") == "end"]
    if ends:
        parts.append(f"the run's end ({ends[-1]})")
    runs = sorted({op.get("run_id", "?") for op in ops})
    return ", ".join(parts) + f" of MLflow run {', '.join(runs)}"


def replay_unsent(spool: str | Path, tracking_uri: str) -> bool:
    """Deliver the spooled operations in order; True when none is left (the file is removed).
    Stops at the first that fails and keeps it and the rest (rewritten atomically)."""
    from hptransfer.io import write_atomic

    spool = Path(spool)
    ops = read_unsent(spool)
    c = client(tracking_uri)
    for i, op in enumerate(ops):
        try:
            _apply(c, op, spool)
        except Exception:
            import json

            write_atomic(spool, "".join(json.dumps(o, default=str) + "\n" for o in ops[i:]))
            return False
    spool.unlink(missing_ok=True)
    return True
