"""`python -m hptransfer.deploy.prestop`: the Ray head pod's preStop hook.

Why: when Kueue preempts a RayJob, KubeRay suspends it by deleting its RayCluster (it does not call
`ray job stop`), and Kubernetes sends SIGTERM to the head container's `ray start`, not to the
`hpt run` driver the job runs there: the driver would die with its Ray, and the large run would lose
every step since its last periodic checkpoint. The hook runs before that SIGTERM: it asks Ray's job
supervisor to stop every running job, which sends each driver SIGTERM (the large run then stops at
its next step boundary after a checkpoint: train/runner.py) and SIGKILLs it only after
RAY_JOB_STOP_WAIT_TIME_S; the hook waits for the jobs to end, at most `--wait` seconds, inside the
pod's terminationGracePeriodSeconds (deploy/render.py sets all three).
"""

from __future__ import annotations

import argparse
import time

from hptransfer.deploy.render import JOB_STOP_WAIT_S

LOCAL_DASHBOARD = "http://127.0.0.1:8265"


def stop_running_jobs(address: str = LOCAL_DASHBOARD, wait_s: float = JOB_STOP_WAIT_S, poll_s: float = 1.0, log=print) -> dict:
    """Stop every running or pending Ray job at `address` and wait until each has ended (or `wait_s`
    passed). Returns each job's final status by submission id. Ray's token, when the cluster uses
    one, comes from RAY_AUTH_TOKEN (KubeRay sets it in every Ray container)."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(address)
    live = (JobStatus.RUNNING, JobStatus.PENDING)
    jobs = [j.submission_id for j in client.list_jobs() if j.submission_id and j.status in live]
    for job in jobs:
        client.stop_job(job)
        log(f"preStop: asked Ray to stop job {job} (its driver gets SIGTERM)")
    deadline = time.monotonic() + wait_s
    while True:
        status = {job: client.get_job_status(job) for job in jobs}
        if all(s.is_terminal() for s in status.values()) or time.monotonic() > deadline:
            break
        time.sleep(poll_s)
    final = {job: str(s.value if hasattr(s, "value") else s) for job, s in status.items()}
    log(f"preStop: jobs ended: {final}" if jobs else "preStop: no running job")
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=LOCAL_DASHBOARD, help="the head's dashboard (Jobs API)")
    parser.add_argument("--wait", type=float, default=JOB_STOP_WAIT_S, help="seconds to wait for the jobs to end")
    args = parser.parse_args(argv)
    try:
        stop_running_jobs(args.address, args.wait)
    except Exception as e:  # a hook that fails must not hold the pod: Kubernetes goes on to SIGTERM
        print(f"preStop: could not stop the jobs: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
