"""The study folder's layout as plain names: every file a study writes, by what it is, and the
tracking URI a folder resolves to. The core of the package: it imports nothing of hptransfer, so any
stage (and `hpt status`, which only reads a folder) can learn a file name without the facade."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

STUDIES_ROOT = Path("studies")
MLFLOW_DB = "mlflow.db"  # the embedded tracking store, when no server is given
PLAN_FILE = "transfer_plan.yaml"  # the plan: in a study folder, its train/ folder and a hand-off folder
DEEPSPEED_CONFIG_FILE = "deepspeed_config.json"  # the large run's (train/) and a hand-off's (trainers/)


@dataclass(frozen=True)
class TrainPaths:
    """The large run's folder (`<study>/train/`); also rebuilt inside each Ray Train worker."""

    root: Path

    @property
    def metrics(self) -> Path:
        return self.root / "train_metrics.json"

    @property
    def deepspeed_config(self) -> Path:
        return self.root / DEEPSPEED_CONFIG_FILE

    @property
    def hf_model(self) -> Path:
        return self.root / "hf_model"

    @property
    def plan(self) -> Path:
        return self.root / PLAN_FILE

    @property
    def ray_storage(self) -> Path:
        return self.root / "ray_results"

    @property
    def ray_experiment(self) -> Path:
        return self.ray_storage / TRAIN_EXPERIMENT

    @property
    def checkpoints_local(self) -> Path:
        return self.root / "checkpoints_local"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def progress(self) -> Path:
        """Rank 0's latest state: step, total, losses, tokens/s, ETA, time (what `hpt status` reads)."""
        return self.root / "progress.json"

    @property
    def progress_log(self) -> Path:
        """Rank 0's progress lines, appended; the driver prints them as they come."""
        return self.root / "progress.log"

    @property
    def stop_request(self) -> Path:
        """Written by the driver when it gets SIGTERM; the workers stop at the next step boundary."""
        return self.root / "stop_request.json"

    @property
    def mlflow_run(self) -> Path:
        """The large run's MLflow run id: a resumed run logs into the same run."""
        return self.root / "mlflow_run.json"

    @property
    def mlflow_unsent(self) -> Path:
        """What could not be logged to MLflow (server unreachable), one operation a line, in order."""
        return self.root / "mlflow_unsent.jsonl"

    @property
    def engine_param_groups(self) -> Path:
        return self.root / "engine_param_groups.json"

    @staticmethod
    def dp_state(checkpoint_dir: Path) -> Path:
        """A private run's checkpoint file (model, optimizer, schedule, accountant, step, seed) inside
        the checkpoint folder Ray Train keeps."""
        return Path(checkpoint_dir) / "dp_state.pt"


TRAIN_EXPERIMENT = "train"  # Ray Train run name (its folder under ray_results/)
SWEEP_EXPERIMENT = "sweep"  # Ray Tune experiment name of the main sweep
DP_SWEEP_EXPERIMENT = "dp_sweep"


@dataclass(frozen=True)
class StudyPaths:
    """Every file of a study folder, by what it is."""

    root: Path

    spec = property(lambda self: self.root / "spec.yaml")
    coord_check_png = property(lambda self: self.root / "coord_check.png")
    coord_check_json = property(lambda self: self.root / "coord_check.json")
    sweep_results = property(lambda self: self.root / "sweep_results.csv")
    sweep_png = property(lambda self: self.root / "sweep.png")
    dp_sweep_results = property(lambda self: self.root / "dp_sweep_results.csv")
    dp_sweep_png = property(lambda self: self.root / "dp_sweep.png")
    dp_grad_norms = property(lambda self: self.root / "dp_grad_norms.json")  # per-example norms, public data
    # The fine-tuning regime (dp.init_from: pretrain, dp/finetune.py): the private part is a study
    # folder of its own (its plan, train/, MLflow runs), with one DP sweep folder per width inside.
    private = property(lambda self: self.root / "private")
    dp_across_width = property(lambda self: self.root / "private" / "dp_across_width.json")
    privacy_ledger = property(lambda self: self.root / "private" / "privacy_ledger.json")  # every read of private data
    private_tuning = property(lambda self: self.root / "private" / "tuning")  # dp.tuning: private (dp/tuning_run.py)

    def private_sweep(self, width: int) -> Path:
        """The DP sweep at `width` (a study folder: its dp_sweep_results.csv, dp_grad_norms.json)."""
        return self.root / "private" / f"dp_sweep_w{width}"

    def pretrained(self, width: int) -> Path:
        """A model pretrained at `width` by the pretraining plan (below the target width; the target's
        is the large run's own train/hf_model)."""
        return self.root / "private" / f"pretrain_w{width}" / "hf_model"

    plan = property(lambda self: self.root / PLAN_FILE)
    ray_storage = property(lambda self: self.root / "ray_results")
    trials_done = property(lambda self: self.root / "trials_done")
    report_dir = property(lambda self: self.root / "report")
    report_html = property(lambda self: self.root / "report" / "index.html")
    report_transfer_png = property(lambda self: self.root / "report" / "transfer.png")
    report_optimum_png = property(lambda self: self.root / "report" / "optimum_vs_width.png")
    mlflow_db = property(lambda self: self.root / MLFLOW_DB)
    log_file = property(lambda self: self.root / "hpt.log")
    lock = property(lambda self: self.root / ".hpt.lock")
    replaced = property(lambda self: self.root / "replaced")

    @property
    def train(self) -> TrainPaths:
        return TrainPaths(self.root / "train")

    def experiment_dir(self, experiment: str) -> Path:
        """Ray Tune's folder of a sweep experiment (what a resumed sweep restores from)."""
        return self.ray_storage / experiment

    def fingerprint(self, experiment: str) -> Path:
        """What a sweep experiment was of (its spec hash): a resume of another spec is refused."""
        return self.ray_storage / f".{experiment}_fingerprint"


def default_tracking_uri(root: str | Path) -> str:
    return f"sqlite:///{Path(root).resolve() / MLFLOW_DB}"


def resolve_tracking_uri(root: str | Path, spec_uri: str | None, flag: str | None) -> str:
    return flag or spec_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)
