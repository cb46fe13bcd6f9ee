"""MLflow at the edges: tracking URI defaults, the sweep's parent/child runs, and a tracker object
training code calls without branching on rank or on whether tracking is on (NullTracker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

TAG_STUDY = "hpt.study_dir"
TAG_KIND = "hpt.kind"
TAG_TRIAL = "hpt.trial_id"


def default_tracking_uri(study_dir: str | Path) -> str:
    return f"sqlite:///{Path(study_dir).resolve() / 'mlflow.db'}"


def resolve_tracking_uri(study_dir: str | Path, spec_uri: str | None, override: str | None) -> str:
    import os

    return override or spec_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(study_dir)


class Tracker(Protocol):
    def log_params(self, params: dict[str, Any]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...
    def set_tags(self, tags: dict[str, Any]) -> None: ...
    def end(self, status: str = "FINISHED") -> None: ...


class NullTracker:
    run_id = None

    def log_params(self, params): pass
    def log_metrics(self, metrics, step=None): pass
    def log_artifact(self, path, artifact_path=None): pass
    def set_tags(self, tags): pass
    def end(self, status="FINISHED"): pass


class MlflowTracker:
    """One MLflow run, used through the client (no global active-run state across processes)."""

    def __init__(self, tracking_uri: str, experiment: str, run_name: str | None = None,
                 tags: dict[str, Any] | None = None, parent_run_id: str | None = None, run_id: str | None = None):
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
        import math
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        ms = [Metric(k, float(v), ts, step or 0) for k, v in metrics.items()
              if isinstance(v, (int, float)) and math.isfinite(float(v))]
        if ms:
            self.client.log_batch(self.run_id, metrics=ms)

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
