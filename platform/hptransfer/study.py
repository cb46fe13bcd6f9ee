"""`Study`: one object, built once from a spec and the command-line flags, that every stage reads.

It owns the study folder's paths (no file name is written anywhere else), the resolved MLflow
tracking URI and experiment (one tracker factory), the Ray settings (one local Ray per `hpt run`,
shared by every stage; `address` joins a cluster) and the study's identity (name, spec hash).

    study = Study.from_spec("search_spaces/quickstart.yaml")
    study.coord_check(); df = study.sweep(); plan = study.transfer(); metrics = study.train(); study.report()

Each method is a stage of `hptransfer.pipeline` (`stage(study) -> artifact`); the CLI verbs, the
launchers and the benchmarks call the same functions.

Tracking URI, resolved once, first match wins: the `--tracking-uri` flag, the spec's
`tracking.uri`, `$MLFLOW_TRACKING_URI`, then `sqlite:///<study_dir>/mlflow.db`. Experiment: the
flag, the spec's `tracking.experiment`, then the study name.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hptransfer.errors import StudyError
from hptransfer.spec import RaySpec, StudySpec, load_spec, parse_spec, spec_hash, sweep_hash

if TYPE_CHECKING:
    import pandas as pd

STUDIES_ROOT = Path("studies")


@dataclass(frozen=True)
class TrainPaths:
    """The large run's folder (`<study>/train/`); also rebuilt inside each Ray Train worker."""

    root: Path

    @property
    def metrics(self) -> Path:
        return self.root / "train_metrics.json"

    @property
    def deepspeed_config(self) -> Path:
        return self.root / "deepspeed_config.json"

    @property
    def hf_model(self) -> Path:
        return self.root / "hf_model"

    @property
    def plan(self) -> Path:
        return self.root / "transfer_plan.yaml"

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
    def engine_param_groups(self) -> Path:
        return self.root / "engine_param_groups.json"

    @staticmethod
    def dp_state(checkpoint_dir: Path) -> Path:
        """A private run's checkpoint file (model, optimizer, schedule, accountant, step, seed) inside
        the checkpoint folder Ray Train keeps."""
        return Path(checkpoint_dir) / "dp_state.pt"


TRAIN_EXPERIMENT = "train"  # Ray Train run name (its folder under ray_results/)
SWEEP_EXPERIMENT = "sweep"  # Ray Tune experiment name of the main sweep
NOISE_EXPERIMENT = "sweep_noise"  # the replicate trials at each width's best point
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
    noise_results = property(lambda self: self.root / "ray_results" / "sweep_noise_results.csv")
    dp_sweep_results = property(lambda self: self.root / "dp_sweep_results.csv")
    dp_sweep_png = property(lambda self: self.root / "dp_sweep.png")
    plan = property(lambda self: self.root / "transfer_plan.yaml")
    ray_storage = property(lambda self: self.root / "ray_results")
    trials_done = property(lambda self: self.root / "trials_done")
    report_dir = property(lambda self: self.root / "report")
    report_html = property(lambda self: self.root / "report" / "index.html")
    report_transfer_png = property(lambda self: self.root / "report" / "transfer.png")
    report_optimum_png = property(lambda self: self.root / "report" / "optimum_vs_width.png")
    mlflow_db = property(lambda self: self.root / "mlflow.db")
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
    return f"sqlite:///{Path(root).resolve() / StudyPaths(Path('.')).mlflow_db.name}"


def resolve_tracking_uri(root: str | Path, spec_uri: str | None, flag: str | None) -> str:
    return flag or spec_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(root)


_HELD: dict[str, int] = {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _acquire(path: Path) -> None:
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(sys.argv[:3]),
    }
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                holder = {}
            if holder.get("host") == me["host"] and isinstance(holder.get("pid"), int) and not _alive(holder["pid"]):
                path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            raise StudyError(
                f"{path.parent} is in use by pid {holder.get('pid')} on {holder.get('host')} since "
                f"{holder.get('started')} ({holder.get('command', '?')}); wait for it to finish, or use another "
                f"--study-dir. If that process is gone (another host), delete {path}"
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        return
    raise StudyError(f"could not take the lock {path}; delete it if no hpt process is using the folder")


class Study:
    """A study: its spec (None for a plan made elsewhere), folder, tracking and Ray settings."""

    def __init__(
        self,
        spec: StudySpec | None,
        root: str | Path,
        *,
        name: str | None = None,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        address: str | None = None,
    ):
        if spec is None and not name:
            raise StudyError("a study needs a spec or at least a name")
        self.spec = spec
        self.name: str = spec.name if spec is not None else str(name)
        self.root = Path(root).resolve()
        self.paths = StudyPaths(self.root)
        tracking = spec.tracking if spec is not None else None
        self.tracking_uri: str = resolve_tracking_uri(self.root, tracking.uri if tracking else None, tracking_uri)
        self.experiment: str = experiment or (tracking.experiment if tracking else None) or self.name
        self.ray: RaySpec = spec.ray if spec is not None else RaySpec()
        self.address = address

    # --- construction ---------------------------------------------------------------------------

    @classmethod
    def from_spec(
        cls,
        spec: StudySpec | str | Path | dict,
        study_dir: str | Path | None = None,
        *,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        address: str | None = None,
    ) -> Study:
        """From a spec (a path, a mapping or a `StudySpec`); the folder defaults to `studies/<name>`."""
        if isinstance(spec, dict):
            spec = parse_spec(spec)
        elif not isinstance(spec, StudySpec):
            spec = load_spec(spec)
        return cls(spec, study_dir or STUDIES_ROOT / spec.name, tracking_uri=tracking_uri, experiment=experiment, address=address)

    @classmethod
    def from_dir(cls, study_dir: str | Path, **flags: Any) -> Study:
        """An existing study folder (its own `spec.yaml`)."""
        paths = StudyPaths(Path(study_dir))
        if not paths.spec.is_file():
            raise StudyError(
                f"{study_dir} is not a study folder (no {paths.spec.name}); run `hpt sweep SPEC "
                f"--study-dir {study_dir}` first, or pass the folder `hpt run` made"
            )
        return cls.from_spec(paths.spec, study_dir, **flags)

    @classmethod
    def for_plan(cls, plan_path: str | Path, study_dir: str | Path | None = None, **flags: Any) -> Study:
        """The study a plan belongs to: its folder's `spec.yaml` when there is one, else the plan's name."""
        from hptransfer.plan import load_plan

        root = Path(study_dir or Path(plan_path).parent)
        if StudyPaths(root).spec.is_file():
            return cls.from_spec(StudyPaths(root).spec, root, **flags)
        return cls(None, root, name=load_plan(plan_path).study, **flags)

    # --- identity and tracking -------------------------------------------------------------------

    @property
    def spec_hash(self) -> str | None:
        return spec_hash(self.spec) if self.spec is not None else None

    @property
    def sweep_hash(self) -> str | None:
        """What the sweep's results belong to (model, data, sweep, seed of the spec)."""
        return sweep_hash(self.spec) if self.spec is not None else None

    # --- one writer per study folder ---------------------------------------------------------------

    @contextlib.contextmanager
    def lock(self):
        """Hold the study folder's lock (pid, host, start time) while a stage writes. Reentrant in
        one process (`hpt run` holds it across its stages); a second process fails fast naming the
        holder; a lock left by a dead process on this host is taken over."""
        key = str(self.paths.lock)
        if _HELD.get(key):
            _HELD[key] += 1
            try:
                yield
            finally:
                _HELD[key] -= 1
            return
        self.root.mkdir(parents=True, exist_ok=True)
        _acquire(self.paths.lock)
        _HELD[key] = 1
        try:
            yield
        finally:
            _HELD.pop(key, None)
            self.paths.lock.unlink(missing_ok=True)

    def move_aside(self, *paths: Path) -> Path | None:
        """Move what a restart replaces under `replaced/<time>/` (never deleted); returns that folder."""
        present = [p for p in paths if p.exists()]
        if not present:
            return None
        dest = self.paths.replaced / dt.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
        for p in present:
            target = dest / p.relative_to(self.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(p), str(target))
        return dest

    def require_spec(self) -> StudySpec:
        if self.spec is None:
            raise StudyError(f"{self.root} has no spec; this stage needs one (pass SPEC)")
        return self.spec

    def tracker(
        self,
        run_name: str | None = None,
        *,
        kind: str | None = None,
        parent_run_id: str | None = None,
        tags: dict[str, Any] | None = None,
        run_id: str | None = None,
    ):
        """An MLflow run of this study (the one way the project writes to MLflow)."""
        from hptransfer.tracking import TAG_KIND, TAG_STUDY, MlflowTracker

        tags = {TAG_STUDY: str(self.root), **({TAG_KIND: kind} if kind else {}), **(tags or {})}
        return MlflowTracker(
            self.tracking_uri, self.experiment, run_name=run_name, tags=tags, parent_run_id=parent_run_id, run_id=run_id
        )

    # --- Ray ------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def ray_session(self):
        """Start a local Ray with the spec's sizes, or join `address`; reentrant: inside an open
        session (one `hpt run`) every stage shares it. Shuts down only what it started.

        Quiet unless `hptransfer.logs.set_verbose(True)`: driver logging and the output of every Ray
        worker and actor go to the study's log file, not the console (see hptransfer/logs.py)."""
        import ray

        from hptransfer import logs
        from hptransfer.env import configure

        configure()
        logs.attach(self.paths.log_file)
        if ray.is_initialized():
            yield
            return
        if self.address:
            ray.init(address=self.address, log_to_driver=True, logging_level="INFO")
        else:
            # Explicit sizes: Ray's defaults take 30% of RAM for the object store and every core.
            # address="local": always a fresh embedded cluster, never a stray `ray start` one.
            ray.init(
                address="local",
                num_cpus=self.ray.num_cpus or os.cpu_count(),
                include_dashboard=False,
                object_store_memory=self.ray.object_store_mb * 1024 * 1024,
                log_to_driver=True,
                configure_logging=True,
                logging_level="INFO",
            )
        if logs.attach_ray() and not logs.is_verbose():
            logs.progress(f"Ray, Ray Train and DeepSpeed output goes to {self.paths.log_file} (hpt --verbose shows it here)")
        try:
            yield
        finally:
            logs.detach_ray()
            ray.shutdown()

    # --- the stages, for notebooks (each returns its artifact) -----------------------------------

    def coord_check(self, widths: list[int] | None = None):
        from hptransfer import pipeline

        return pipeline.coord_check_stage(self, widths=widths)

    def sweep(self, *, restart: bool = False) -> pd.DataFrame:
        from hptransfer import pipeline

        return pipeline.sweep_stage(self, restart=restart).table

    def transfer(self):
        from hptransfer import pipeline

        return pipeline.transfer_stage(self)

    def train(self, plan=None, **knobs: Any) -> dict:
        from hptransfer import pipeline

        return pipeline.train_stage(self, plan, **knobs)

    def report(self) -> Path:
        from hptransfer import pipeline

        return pipeline.report_stage(self)

    def run(self, **kw: Any) -> dict:
        from hptransfer import pipeline

        return pipeline.run_study(self, **kw)

    def __repr__(self) -> str:
        return f"Study({self.name!r}, root={str(self.root)!r}, tracking_uri={self.tracking_uri!r})"
