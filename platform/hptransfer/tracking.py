"""MLflow at the edges, through one idiom. The core of tracking: it imports nothing of hptransfer,
so any layer can hold a tracker.

- `Tracker`, the protocol every stage writes through; its backends: `MlflowTracker` (MLflow's
  client, no global active-run state; made by `StudyContext.tracker`) and `NullTracker`, so training
  code never branches on rank or on whether tracking is on;
- `BatchedMetrics`, per-step metrics written in batches (the large run's rank 0);
- `find_study_run`, a study's run of one kind (its sweep parent run), found by tags.

The parent/child logger every sweep uses is the sweep stage's (`hptransfer.sweep.record.log_sweep_runs`)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

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
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri)
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
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if not exp:
        return None
    runs = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.`{TAG_STUDY}` = '{study_root}' and tags.`{TAG_KIND}` = '{kind}'"
    )
    return runs[0].info.run_id if runs else None
