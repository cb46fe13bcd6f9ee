"""`StudyContext`: one object, built once from a spec and the command-line flags, that every stage
takes. It owns the study folder's paths (`hptransfer.layout`: no file name is written anywhere
else), the resolved MLflow tracking URI and experiment (one tracker factory), the Ray settings (one
local Ray per `hpt run`, shared by every stage; `address` joins a cluster), the study's lock and
its identity (name, spec hash). Stages import this, never the facade (`hptransfer.pipeline.Study`,
the same object with the stage methods for notebooks).

Tracking URI, resolved once, first match wins: the `--tracking-uri` flag, the spec's
`tracking.uri`, `$MLFLOW_TRACKING_URI`, then `sqlite:///<study_dir>/mlflow.db`. Experiment: the
flag, the spec's `tracking.experiment`, then the study name.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Any

from typing_extensions import Self

from hptransfer.errors import StudyError
from hptransfer.layout import STUDIES_ROOT, StudyPaths, resolve_tracking_uri
from hptransfer.lock import hold
from hptransfer.spec import RaySpec, StudySpec, load_spec, parse_spec, spec_hash, sweep_hash


class StudyContext:
    """A study: its spec (None for a plan made elsewhere), folder, tracking and Ray settings.

    What every stage takes. The notebook facade `hptransfer.pipeline.Study` adds the stage methods."""

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
    ) -> Self:
        """From a spec (a path, a mapping or a `StudySpec`); the folder defaults to `studies/<name>`."""
        if isinstance(spec, dict):
            spec = parse_spec(spec)
        elif not isinstance(spec, StudySpec):
            spec = load_spec(spec)
        return cls(spec, study_dir or STUDIES_ROOT / spec.name, tracking_uri=tracking_uri, experiment=experiment, address=address)

    @classmethod
    def from_dir(cls, study_dir: str | Path, **flags: Any) -> Self:
        """An existing study folder (its own `spec.yaml`)."""
        paths = StudyPaths(Path(study_dir))
        if not paths.spec.is_file():
            raise StudyError(
                f"{study_dir} is not a study folder (no {paths.spec.name}); run `hpt sweep SPEC "
                f"--study-dir {study_dir}` first, or pass the folder `hpt run` made"
            )
        return cls.from_spec(paths.spec, study_dir, **flags)

    @classmethod
    def for_plan(cls, plan_path: str | Path, study_dir: str | Path | None = None, **flags: Any) -> Self:
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

    def lock(self):
        """Hold the study folder's lock (pid, host, start time) while a stage writes. Reentrant in
        one process (`hpt run` holds it across its stages); a second process fails fast naming the
        holder; a lock left by a dead process on this host is taken over."""
        return hold(self.paths.lock)

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
            start_local_ray(
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, root={str(self.root)!r}, tracking_uri={self.tracking_uri!r})"


RAY_START_TRIES = 3


def start_local_ray(**kwargs) -> None:
    """`ray.init(address="local", **kwargs)`, tried up to RAY_START_TRIES times when the new node
    times out during start-up. Ray waits a fixed 30 s for its raylet to register with the GCS
    (ray/_private/node.py); on a busy machine (2 cores, other jobs) it can take longer, and the
    whole run would fail on a transient. Any other error is raised at once."""
    import logging

    import ray

    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            ray.init(address="local", **kwargs)
            return
        except Exception as e:
            if attempt == RAY_START_TRIES or "timed out during startup" not in str(e):
                raise
            logging.getLogger(__name__).warning(
                "Ray's local node did not start within Ray's 30 s (a busy machine?): try %d of %d", attempt + 1, RAY_START_TRIES
            )
            ray.shutdown()
