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

# Never upload these: the venv alone is GBs (Ray refuses packages over 500 MiB), and local
# study outputs, caches and VCS data are not inputs of a job.
DEFAULT_EXCLUDES = [
    ".venv/", ".git/", "studies/", "runs/", "mlruns/", "mlartifacts/", ".cache/",
    "__pycache__/", "*.pyc", "*.egg-info/", ".pytest_cache/", "build/",
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


def runtime_env(project: Path, env_vars: dict[str, str] | None = None,
                extra_excludes: list[str] | None = None) -> dict[str, Any]:
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


def hpt_entrypoint(verb: str, spec: str, *args: str) -> str:
    """`hpt <verb> <spec> <args...> [--address auto]`, shell-quoted (Ray runs it in a shell)."""
    extra = ["--address", "auto"] if verb in JOINS_CLUSTER and "--address" not in args else []
    return shlex.join(["hpt", verb, spec, *args, *extra])


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
