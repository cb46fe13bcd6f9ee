#!/usr/bin/env python
"""Run a study on Kubernetes as a KubeRay RayJob:

    python launchers/kubernetes.py search_spaces/quickstart.yaml --image REGISTRY/hptransfer:TAG \
        [--namespace hptransfer] [--workers 2] [--gpus-per-worker 1] [--queue LOCALQUEUE] [--out rayjob.yaml]

Renders the spec's ConfigMap and the RayJob (`hpt k8s render`; the study is the spec's `name`)
and applies them with `kubectl` when a cluster is configured
(kubectl has a current context); otherwise, or with --out, writes the manifest and says how to
apply it. The namespace needs k8s/ applied first (MLflow, the hpt-studies volume, the
NetworkPolicies, the hptransfer ServiceAccount): kubectl apply -k k8s/overlays/cpu-dev
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from hptransfer.deploy import kube
from hptransfer.deploy.cli import request_from_flags, write_atomic
from hptransfer.deploy.render import render_study, to_yaml

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


@app.command()
def main(
    spec: Annotated[Path, typer.Argument(metavar="SPEC", help="Study spec YAML (travels in a ConfigMap).")],
    image: Annotated[str, typer.Option(help="Image built from the repo's Dockerfile.")] = "hptransfer",
    namespace: Annotated[str, typer.Option()] = "hptransfer",
    workers: Annotated[int, typer.Option()] = 1,
    gpus_per_worker: Annotated[int, typer.Option()] = 0,
    queue: Annotated[Optional[str], typer.Option(help="Kueue LocalQueue (RayJob created suspended).")] = None,
    active_deadline_seconds: Annotated[int, typer.Option(help="Wall-clock cap in seconds; 0: none.")] = 86_400,
    out: Annotated[Optional[Path], typer.Option(help="Write the manifests here and do not apply them.")] = None,
    dry_run: Annotated[bool, typer.Option(help="kubectl apply --dry-run=server.")] = False,
) -> None:
    req = request_from_flags(
        spec,
        image=image,
        namespace=namespace,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        queue=queue,
        active_deadline_seconds=active_deadline_seconds or None,
    )
    manifest = to_yaml(render_study(req))
    context = None if out else kube.current_context()
    if context is None:
        target = out or Path("studies") / req.study / "rayjob.yaml"
        write_atomic(target, manifest)
        why = "" if out else " (no kubectl context configured)"
        typer.echo(f"wrote {target}{why}; apply with: kubectl apply -f {target}", err=True)
        return
    typer.echo(
        f"applying ConfigMap {namespace}/{req.spec_configmap} and RayJob {namespace}/{req.job_name} to context {context}",
        err=True,
    )
    code = kube.apply(manifest, dry_run=dry_run)
    if code == 0 and not dry_run:
        queued = f" (suspended until Kueue queue {queue!r} admits it)" if queue else ""
        typer.echo(
            f"follow{queued}: kubectl -n {namespace} get rayjob {req.job_name} -w; "
            f"logs: kubectl -n {namespace} logs -f job/{req.job_name}",
            err=True,
        )
    sys.exit(code)


if __name__ == "__main__":
    app()
