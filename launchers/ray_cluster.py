#!/usr/bin/env python
"""Run a study on an existing Ray cluster through the Ray Jobs API.

    python launchers/ray_cluster.py search_spaces/quickstart.yaml --address http://HEAD:8265 \
        [--verb run|sweep] [--tracking-uri http://mlflow:5000] [--study-root /studies] [-- extra hpt flags]

The project travels as the job's working_dir (the spec with it; secrets, databases, virtual
environments and study folders excluded, see `--list-upload`), the job's logs stream here, and
this process exits with the job's exit code. The study folder is <study-root>/<spec name> on the
cluster (default /studies/<name>, the shared volume of the k8s RayCluster): the job's working
directory is temporary and vanishes with the job. On a token-auth cluster (Ray's default) export
RAY_AUTH_MODE=token and RAY_AUTH_TOKEN (or keep the token in ~/.ray/auth_token).
On Kubernetes: `kubectl -n hptransfer port-forward svc/hpt-sweeps-head-svc 8265` first.
"""

from __future__ import annotations

import sys
from pathlib import Path, PurePosixPath
from typing import Annotated, Optional

import typer

from hptransfer.deploy import ray_jobs
from hptransfer.errors import HptError
from hptransfer.spec import load_spec

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def main(
    ctx: typer.Context,
    spec: Annotated[Path, typer.Argument(metavar="SPEC", help="Study spec inside the project.")],
    address: Annotated[
        Optional[str], typer.Option(envvar="RAY_API_SERVER_ADDRESS", help="Ray dashboard / Jobs API, e.g. http://127.0.0.1:8265.")
    ] = None,
    verb: Annotated[str, typer.Option(help="hpt command to run on the cluster.")] = "run",
    tracking_uri: Annotated[
        Optional[str], typer.Option(envvar="MLFLOW_TRACKING_URI", help="MLflow server the job logs to.")
    ] = None,
    study_root: Annotated[
        str,
        typer.Option(
            help="Shared folder on the cluster; the study goes to STUDY_ROOT/<spec name> unless --study-dir is passed through."
        ),
    ] = ray_jobs.DEFAULT_STUDY_ROOT,
    entrypoint: Annotated[
        Optional[str], typer.Option(help="Run this shell command instead of `hpt VERB SPEC` (same runtime env).")
    ] = None,
    working_dir: Annotated[Optional[Path], typer.Option(help="Folder shipped as working_dir; default the project.")] = None,
    timeout_s: Annotated[Optional[float], typer.Option(help="Stop the job after this many seconds.")] = None,
    list_upload: Annotated[
        bool, typer.Option("--list-upload", help="Print every file Ray would upload (Ray's own packaging) and exit.")
    ] = False,
) -> None:
    project = (working_dir or ray_jobs.project_root(spec.resolve().parent)).resolve()
    try:
        spec_rel = ray_jobs.spec_in_project(spec, project)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="SPEC") from None
    if not (project / spec_rel).is_file():
        raise typer.BadParameter(f"no such file {str(spec)!r}", param_hint="SPEC")
    env_vars = {"MLFLOW_TRACKING_URI": tracking_uri} if tracking_uri else {}
    env = ray_jobs.runtime_env(project, env_vars)
    if list_upload:
        for package, files in ray_jobs.upload_listing(env).items():
            typer.echo(f"# {package}: {len(files)} files")
            typer.echo("\n".join(files))
        return
    if not address:
        raise typer.BadParameter("missing: pass --address http://HEAD:8265 or set RAY_API_SERVER_ADDRESS", param_hint="--address")
    if entrypoint:
        cmd = entrypoint
    else:
        try:
            name = load_spec(project / spec_rel).name  # the study is the spec's name, not its file name
        except HptError as e:
            raise typer.BadParameter(str(e), param_hint="SPEC") from None
        study_dir = str(PurePosixPath(study_root) / name)
        cmd = ray_jobs.hpt_entrypoint(verb, spec_rel, *ctx.args, study_dir=study_dir)
        if verb in ray_jobs.TAKES_STUDY_DIR and not ray_jobs.has_flag(tuple(ctx.args), "--study-dir", "-o"):
            typer.echo(
                f"[hptransfer] study folder on the cluster: {study_dir} (must be shared by every node; "
                "--study-root or --study-dir to change)",
                err=True,
            )
    try:
        outcome = ray_jobs.submit_and_follow(address, cmd, env, timeout_s=timeout_s)
    except ConnectionError as e:
        typer.echo(
            f"[hptransfer] {e} Is the dashboard reachable there (on Kubernetes: kubectl port-forward "
            "svc/<cluster>-head-svc 8265)?",
            err=True,
        )
        sys.exit(1)
    typer.echo(
        f"[hptransfer] job {outcome.job_id}: {outcome.status} (exit {outcome.exit_code})"
        + (f" {outcome.message}" if outcome.status != "SUCCEEDED" else ""),
        err=True,
    )
    sys.exit(outcome.exit_code)


if __name__ == "__main__":
    app()
