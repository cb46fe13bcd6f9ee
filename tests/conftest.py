"""Shared fixtures: one real local Ray for the session, a real `mlflow server` process on loopback,
one real `hpt run` study for the session, tiny specs. Nothing here is mocked.

Tiers: a test is `slow` when it starts Ray, DeepSpeed, an MLflow server or an `hpt` pipeline, or
takes more than ~5 s on 2 cores. `.ci/run` runs `-m "not slow"` first (a broken build fails in
minutes), then `-m slow`. A test that uses one of the fixtures below that start such a service
is marked `slow` here, whatever its module says."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Tiny models on 2 shared cores: one thread each is far faster than oversubscribed thread pools
# (trials and workers set their own thread counts from the spec).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from hptransfer.env import configure  # noqa: E402

configure()


_PORTS_GIVEN: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before by this process: once a probe socket is closed the
    OS may give the same ephemeral port to the next bind, and two of a `ray start`'s components on one
    port fail it (seen in CI: node manager and dashboard agent both on 52853)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port
    raise RuntimeError("no free port that was not handed out already")


def tiny_spec_dict(**over) -> dict:
    """A spec that trains in seconds: width 16–32 MLP or Llama, a handful of steps."""
    d = {
        "name": "tiny",
        "model": {"family": "mlp", "depth": 2, "head_dim": 8, "seq_len": 16, "parametrization": "mup"},
        "data": {"max_files": 40, "eval_batches": 2},
        "sweep": {
            "widths": [16, 32],
            "grid": {"lr": [0.003, 0.03, 0.3]},
            "steps": 12,
            "batch_size": 8,
            "noise_seeds": 0,
            "fixed": {"warmup_steps": 2},
        },
        "target": {"width": 64, "steps": 6, "batch_size": 8},
        "train": {"workers": 2, "zero_stage": 1, "eval_every": 3},
        "ray": {"num_cpus": 2, "object_store_mb": 256},
    }
    for key, val in over.items():
        if isinstance(val, dict) and isinstance(d.get(key), dict):
            d[key] = {**d[key], **val}
        else:
            d[key] = val
    return d


@pytest.fixture
def tiny_spec():
    from hptransfer.spec import parse_spec

    return parse_spec(tiny_spec_dict())


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for every test that needs it (start-up costs seconds and ~1 GB)."""
    import ray

    from hptransfer.context import start_local_ray  # retries a start-up timeout on a busy machine

    start_local_ray(  # address="local": never a `ray start` cluster another test (or xdist worker) has up
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=256 * 1024 * 1024,
        logging_level="WARNING",
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


# Fixtures that start Ray, an MLflow server or an `hpt run`: their tests are slow by definition.
SLOW_FIXTURES = {"ray_local", "mlflow_server", "hpt_run_study"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if SLOW_FIXTURES & fixtures and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)

    # Under `pytest -n 2 --dist loadfile` (the README's command) a module's tests run on one worker
    # (module fixtures are made once); the session's `hpt run` is shared across workers by a file
    # lock (hpt_run_study). The longest reader's module goes first, so the study is started at once
    # while the other worker runs other modules; the other readers find it made.
    # (`--dist loadgroup` would be the finer tool, but pytest-xdist 3.8 marks a group in
    # `item._nodeid`, which pytest 9's `nodeid` no longer reads: every test becomes its own group.)
    # Then the longest modules first (longest-processing-time order: xdist hands out modules in this
    # order — with --no-loadscope-reorder, set in pyproject.toml — so no long module starts last while
    # the other worker idles), except that the other worker's first module does not need the study
    # (it would only wait for it).
    def module(it) -> str:
        return it.nodeid.split("::", 1)[0]

    readers = {module(it) for it in items if "hpt_run_study" in getattr(it, "fixturenames", ())}
    first = max(sorted(readers), key=lambda m: MODULE_SECONDS.get(m, 0), default=None)  # the longest reader
    # (Deterministic: every xdist worker must collect the same order. Ties keep collection order.)
    modules = [m for m in dict.fromkeys(module(it) for it in items) if m != first]
    rest = sorted(modules, key=lambda m: -MODULE_SECONDS.get(m, 0))
    second = next((m for m in rest if m not in readers), None)
    order = [m for m in (first, second) if m] + [m for m in rest if m != second]
    rank = {m: i for i, m in enumerate(order)}
    items.sort(key=lambda it: rank[module(it)])


# Slow-tier seconds per module (pytest --durations, 2 xdist workers, 2026-12-05; approximate, only
# the order matters). A module not listed sorts after these, in collection order.
MODULE_SECONDS = {
    "tests/test_train.py": 410,
    "tests/test_faults_run.py": 250,
    "tests/test_launchers.py": 200,  # + the large run across the two nodes (~55 s)
    "tests/test_study.py": 175,
    "tests/test_dp_large_run.py": 165,
    "tests/test_sweep_resume.py": 110,
    "tests/test_dp_finetune.py": 110,
    "tests/test_axes_run.py": 95,
    "tests/test_user_paths.py": 75,
    "tests/test_data_files.py": 90,
    "tests/test_dp_sweep.py": 40,
    "tests/test_calibration.py": 30,
    "tests/test_sweep_search.py": 75,
    "tests/test_sweep.py": 30,
}


# The shared study's large run: steps, and validation every EVAL_EVERY steps (so the console shows
# steps with and without a val loss). The coordinate check's widths: two widths this small give a
# Llama µP slope too noisy to pass (down_proj −0.4 at 16, 32); four fit one well (−0.06), in seconds.
E2E_STEPS, E2E_EVAL_EVERY, E2E_COORD_WIDTHS = 10, 5, [16, 32, 64, 128]


def e2e_spec_dict() -> dict:
    """The shared `hpt run` study: a 1-layer Llama ladder 16, 32 (3 LRs: 6 trials) → width 64 on 2
    DeepSpeed workers, 8 sequences a step; a Llama so the large run also exports a Hugging Face model."""
    return tiny_spec_dict(
        name="e2e",
        model={"family": "llama", "head_dim": 16, "seq_len": 16, "depth": 1},
        coord_check={"widths": E2E_COORD_WIDTHS},
        sweep={"widths": [16, 32], "grid": {"lr": [0.003, 0.03, 0.3]}},
        target={"width": 64, "steps": E2E_STEPS, "batch_size": 8},
        train={"eval_every": E2E_EVAL_EVERY},
    )


@pytest.fixture(scope="session")
def hpt_run_study(tmp_path_factory) -> dict:
    """ONE `hpt run` as a user runs it, made once per session and read by test_console.py and
    test_pipeline.py: a fresh process, its own local Ray, the coordinate check, a Tune sweep, the
    transfer, a 2-worker Ray Train + DeepSpeed run, MLflow on SQLite, the report. Several full runs
    were the suite's largest cost. Read only: a test that re-runs or edits the study copies it first
    (`shutil.copytree`), so no test sees another's changes, in any order.

    Under pytest-xdist each worker is its own session: the first worker to need the study makes it
    in the run's shared base folder under a file lock, and the others wait for it and read it
    (pytest-xdist's documented pattern), so the whole run makes it once."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by every worker of this run
    root = base / "hpt_run_shared"
    done = root / "result.json"
    with FileLock(str(base / "hpt_run_shared.lock")):
        if not done.is_file():
            root.mkdir(exist_ok=True)
            spec = root / "e2e.yaml"
            spec.write_text(yaml.safe_dump(e2e_spec_dict()))
            study = root / "study"
            r = subprocess.run(
                [sys.executable, "-m", "hptransfer", "run", str(spec), "--study-dir", str(study)],
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
            out = {"spec": str(spec), "dir": str(study), "stdout": r.stdout, "console": r.stdout + r.stderr}
            tmp = done.with_suffix(".tmp")
            tmp.write_text(json.dumps(out))
            os.replace(tmp, done)
    out = json.loads(done.read_text())
    study = Path(out["dir"])
    return {**out, "spec": Path(out["spec"]), "dir": study, "log": (study / "hpt.log").read_text()}


def start_mlflow_server(root: Path, port: int) -> subprocess.Popen:
    """A real `mlflow server` on loopback over `root/mlflow.db` (lean: one worker, no job execution),
    returned once it answers /health. Its log is appended to, so a restart on the same store (the
    faults test) keeps both lives' lines."""
    from hptransfer.tracking import seed_sqlite_store

    seed_sqlite_store(f"sqlite:///{root}/mlflow.db")  # MLflow's empty store, migrated once (test_mlflow_store.py)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{root}/mlflow.db",
            "--default-artifact-root",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=open(root / "server.log", "ab"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    import urllib.request

    deadline = time.time() + 90
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except Exception:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                raise RuntimeError("mlflow server did not start:\n" + (root / "server.log").read_text()[-3000:]) from None
            time.sleep(0.3)


def stop_process(proc: subprocess.Popen, wait_s: float = 15) -> None:
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on loopback, for the session."""
    root = tmp_path_factory.mktemp("mlflow_server")
    port = free_port()
    proc = start_mlflow_server(root, port)
    yield f"http://127.0.0.1:{port}"
    stop_process(proc, 10)


@pytest.fixture(autouse=True)
def _no_leaked_tracking_uri():
    """`mlflow.set_tracking_uri` also sets $MLFLOW_TRACKING_URI, which `hpt` honours and child
    processes inherit: keep one test's store from leaking into the next."""
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)
