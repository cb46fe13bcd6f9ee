"""Run an `hpt` command on an existing Ray cluster through the Ray Jobs API.

The project folder travels as the job's `working_dir` (so the spec, given relative to it, is
there too) and `platform/hptransfer` as a `py_module`, so the cluster runs this checkout's code,
not whatever version its image holds. Logs stream back while the job runs; the caller gets
the job's final status and its driver's exit code.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

# Never upload these with the project (`working_dir`) or the package (`py_modules`): a Ray
# cluster is often shared, and whatever is uploaded is readable by every job on it. Ray's own
# defaults (.git, .venv, venv, __pycache__) can be switched off by an environment variable and
# `.gitignore` is skipped under RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1, so this list stands on its
# own. The repo's `.rayignore` holds the same patterns (a test keeps them equal) for uploads
# made without this module (`ray job submit --working-dir .`). gitignore syntax: a pattern
# without `/` matches at any depth, a trailing `/` matches directories only.
DEFAULT_EXCLUDES = [
    # secrets: dotenv files, keys and certificates' private halves, Ray/cloud/SSH credentials
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "id_rsa*",
    "id_ed25519*",
    "id_ecdsa*",
    ".ray/",
    "auth_token",
    "*.token",
    ".netrc",
    ".pypirc",
    ".git-credentials",
    ".ssh/",
    ".aws/",
    ".kube/",
    "kubeconfig",
    ".docker/",
    # version control
    ".git/",
    # local databases and tracking stores
    "*.db",
    "*.sqlite",
    "*.sqlite3",
    "mlruns/",
    "mlartifacts/",
    # virtual environments
    ".venv/",
    "venv/",
    ".tox/",
    ".nox/",
    # caches and build outputs
    ".cache/",
    "__pycache__/",
    "*.pyc",
    "*.egg-info/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".mypy_cache/",
    ".hypothesis/",
    "build/",
    "dist/",
    # study folders and run outputs (written on the cluster, never read from here)
    "studies/",
    "runs/",
    "ray_results/",
]
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    status: str
    """Ray's final JobStatus: SUCCEEDED, FAILED or STOPPED."""
    exit_code: int
    """The entrypoint's exit code where Ray reports it; else 0 for SUCCEEDED and 1 otherwise."""
    message: str = ""


def project_root(start: Path | None = None) -> Path:
    """The folder holding pyproject.toml, searched upward from `start` (default: this file)."""
    here = (start or Path(__file__)).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / "platform" / "hptransfer").is_dir():
            return d
    raise FileNotFoundError(f"no hptransfer project (pyproject.toml + platform/hptransfer) above {here}")


def spec_in_project(spec: Path, project: Path) -> str:
    """The spec's path relative to the project: the job's working directory is the project."""
    try:
        return spec.resolve().relative_to(project.resolve()).as_posix()
    except ValueError:
        raise ValueError(
            f"spec {str(spec)!r} is outside the project {str(project)!r}, so the job's working_dir "
            "would not carry it; copy it into search_spaces/ (or pass --working-dir a folder that "
            "holds it)"
        ) from None


def runtime_env(project: Path, env_vars: dict[str, str] | None = None, extra_excludes: list[str] | None = None) -> dict[str, Any]:
    """Ray runtime_env carrying the project as working_dir and the package as a py_module."""
    env: dict[str, Any] = {
        "working_dir": str(project),
        "excludes": DEFAULT_EXCLUDES + list(extra_excludes or []),
        "env_vars": {"RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1", **(env_vars or {})},
    }
    pkg = project / "platform" / "hptransfer"
    if pkg.is_dir():
        env["py_modules"] = [str(pkg)]
    return env


# Verbs that start Ray themselves unless given --address; under the Jobs API they must join the
# job's cluster instead (RAY_ADDRESS is set for the driver, so `auto` finds it).
JOINS_CLUSTER = {"run", "sweep"}
# Where a job's study folder goes unless --study-dir says otherwise: the job's working directory
# is a temporary copy deleted with the job (and not shared between nodes), so the default is a
# shared volume, mounted here on every node of the k8s RayCluster (`hpt-studies`).
DEFAULT_STUDY_ROOT = "/studies"
TAKES_STUDY_DIR = {"run", "sweep", "coord-check", "dp-sweep"}


def hpt_entrypoint(verb: str, spec: str, *args: str, study_dir: str | None = None) -> str:
    """`hpt <verb> <spec> <args...> [--study-dir D] [--address auto]`, shell-quoted (Ray runs it
    in a shell). `study_dir` is added only where the verb takes one and `args` do not set it."""
    extra = ["--address", "auto"] if verb in JOINS_CLUSTER and "--address" not in args else []
    if study_dir and verb in TAKES_STUDY_DIR and not has_flag(args, "--study-dir", "-o"):
        extra = ["--study-dir", study_dir, *extra]
    return shlex.join(["hpt", verb, spec, *args, *extra])


def has_flag(args: tuple[str, ...], *names: str) -> bool:
    """`args` set one of the flags `names`, as `--flag value` or `--flag=value`."""
    return any(a in names or a.startswith(tuple(f"{n}=" for n in names)) for a in args)


def upload_listing(env: dict[str, Any]) -> dict[str, list[str]]:
    """What Ray would upload for this runtime_env: package path -> the file names in its zip.

    Built by Ray's own packaging code (`create_package`, the function the Jobs SDK's upload calls)
    with the excludes Ray itself combines: its defaults (RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES),
    `.gitignore` (unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1) and `.rayignore` in each folder, and
    the runtime_env's `excludes`. `py_modules` get no Ray defaults, as in Ray.
    """
    import os
    import tempfile
    import zipfile

    from ray._private import ray_constants
    from ray._private.runtime_env.packaging import create_package

    include_gitignore = os.environ.get(ray_constants.RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"
    user = list(env.get("excludes") or [])
    packages = []
    if env.get("working_dir"):
        packages.append((env["working_dir"], False, ray_constants.get_runtime_env_default_excludes() + user))
    packages += [(m, True, user) for m in env.get("py_modules") or []]
    out: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="hpt-upload-") as tmp:
        for i, (path, parent, excludes) in enumerate(packages):
            target = Path(tmp) / f"{i}.zip"
            create_package(str(path), target, include_gitignore=include_gitignore, include_parent_dir=parent, excludes=excludes)
            with zipfile.ZipFile(target) as z:
                out[str(path)] = sorted(n for n in z.namelist() if not n.endswith("/"))
    return out


def _status(info: Any) -> str:
    return getattr(info.status, "value", str(info.status))  # JobStatus is a str Enum


async def _follow(client: Any, job_id: str, sink: TextIO) -> None:
    async for chunk in client.tail_job_logs(job_id):
        sink.write(chunk)
        sink.flush()


def submit_and_follow(
    address: str,
    entrypoint: str,
    runtime_env: dict[str, Any],
    *,
    submission_id: str | None = None,
    entrypoint_num_cpus: float | None = None,
    timeout_s: float | None = None,
    sink: TextIO = sys.stdout,
) -> JobOutcome:
    """Submit `entrypoint`, stream its logs to `sink` until it ends, return its outcome.

    `address` is the cluster's dashboard (http://HOST:8265). On timeout or Ctrl-C the job is
    stopped, not abandoned: a sweep left running on a shared cluster holds its CPUs/GPUs.
    """
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    job_id = client.submit_job(
        entrypoint=entrypoint,
        runtime_env=runtime_env,
        submission_id=submission_id,
        entrypoint_num_cpus=entrypoint_num_cpus,
        metadata={"submitted_by": "hptransfer"},
    )
    sink.write(f"[hptransfer] submitted {job_id} to {address}: {entrypoint}\n")
    try:
        asyncio.run(asyncio.wait_for(_follow(client, job_id, sink), timeout=timeout_s))
    except (asyncio.TimeoutError, KeyboardInterrupt):
        client.stop_job(job_id)
        sink.write(f"[hptransfer] stopped {job_id} (timeout {timeout_s}s or interrupt)\n")
    # The log stream closes when the driver exits; the status may lag it by a moment.
    deadline = time.monotonic() + 60
    info = client.get_job_info(job_id)
    while _status(info) not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.5)
        info = client.get_job_info(job_id)
    status = _status(info)
    code = getattr(info, "driver_exit_code", None)
    if code is None:
        code = 0 if status == "SUCCEEDED" else 1
    return JobOutcome(job_id=job_id, status=status, exit_code=int(code), message=info.message or "")
