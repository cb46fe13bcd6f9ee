"""`hpt k8s ...`: Kubernetes (KubeRay) commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError

from hptransfer.deploy.render import RayJobRequest, render_study, to_yaml
from hptransfer.errors import HptError
from hptransfer.io import write_atomic
from hptransfer.spec import load_spec

app = typer.Typer(help="Kubernetes (KubeRay) manifests for a study.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Kubernetes (KubeRay) manifests for a study."""  # keeps `render` a sub-command


# pydantic field -> the flag a user types, so errors name what to change.
_FLAGS = {
    "study": "SPEC (its `name`)",
    "spec_yaml": "SPEC",
    "image": "--image",
    "namespace": "--namespace",
    "name": "--name",
    "workers": "--workers",
    "gpus_per_worker": "--gpus-per-worker",
    "cpus_per_worker": "--cpus-per-worker",
    "memory_per_worker": "--memory-per-worker",
    "tracking_uri": "--tracking-uri",
    "queue": "--queue",
    "active_deadline_seconds": "--active-deadline-seconds",
}

# Flags whose None is a choice ("no cap"), not "use the default".
_NONE_MEANS_OFF = {"active_deadline_seconds"}


def request_from_flags(spec: Path, **flags: object) -> RayJobRequest:
    """Build the request from the spec file (its `name` names the study; its text goes into the
    ConfigMap), raising typer.BadParameter with *every* problem named by its flag."""
    problems: list[str] = []
    study, text = "", ""
    try:
        study = load_spec(spec).name
        text = spec.read_text()
    except HptError as e:
        problems += [f"SPEC: {spec}: {p}" for p in e.problems]
    try:
        given = {k: v for k, v in flags.items() if v is not None or k in _NONE_MEANS_OFF}
        req = RayJobRequest(study=study, spec_yaml=text, **given)
    except ValidationError as e:
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
            if problems and field in ("study", "spec_yaml", ""):
                continue  # the spec did not load: its problems are listed already
            flag = _FLAGS.get(field, field or "--name")
            msg = str(err["msg"])
            if msg.startswith("Value error, "):  # our validators already quote the value
                problems.append(f"{flag}: {msg.removeprefix('Value error, ')}")
            else:
                problems.append(f"{flag}: {msg} (got {err.get('input')!r})")
        req = None
    if problems:
        raise typer.BadParameter("\n  " + "\n  ".join(problems))
    assert req is not None
    return req


@app.command()
def render(
    spec: Annotated[Path, typer.Argument(metavar="SPEC", help="Study spec YAML (any path; it travels in a ConfigMap).")],
    image: Annotated[
        str, typer.Option(help="Image built from the repo's Dockerfile; pin with NAME@sha256:DIGEST.")
    ] = "hptransfer",
    namespace: Annotated[str, typer.Option(help="Namespace with the mlflow Service, hpt-studies PVC.")] = "hptransfer",
    workers: Annotated[int, typer.Option(help="Ray worker pods.")] = 1,
    gpus_per_worker: Annotated[int, typer.Option(help="nvidia.com/gpu per worker (0: CPU workers).")] = 0,
    cpus_per_worker: Annotated[str, typer.Option(help="CPU per worker (Kubernetes quantity).")] = "2",
    memory_per_worker: Annotated[str, typer.Option(help="Memory per worker (Kubernetes quantity).")] = "4Gi",
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow URI; default the mlflow Service.")] = None,
    name: Annotated[Optional[str], typer.Option(help="RayJob name; default hpt-<spec name>.")] = None,
    queue: Annotated[
        Optional[str],
        typer.Option(help="Kueue LocalQueue: adds the kueue.x-k8s.io/queue-name label and creates the RayJob suspended."),
    ] = None,
    active_deadline_seconds: Annotated[
        int, typer.Option(help="Wall-clock cap of the RayJob in seconds (cluster start included); 0: no cap.")
    ] = 86_400,
    out: Annotated[Optional[Path], typer.Option(help="Write here instead of stdout.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the manifests to stdout; write nothing.")] = False,
) -> None:
    """Render a ConfigMap with SPEC and a KubeRay RayJob that runs `hpt run` on it (apply both with
    `kubectl apply -f`): any spec runs on the published image, no rebuild."""
    req = request_from_flags(
        spec,
        image=image,
        namespace=namespace,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        cpus_per_worker=cpus_per_worker,
        memory_per_worker=memory_per_worker,
        tracking_uri=tracking_uri,
        name=name,
        queue=queue,
        active_deadline_seconds=active_deadline_seconds or None,
    )
    text = to_yaml(render_study(req))
    what = f"ConfigMap {req.namespace}/{req.spec_configmap}, RayJob {req.namespace}/{req.job_name}"
    if out is None or dry_run:
        typer.echo(text, nl=False)
        if dry_run and out is not None:
            typer.echo(f"dry run: {out} not written ({what})", err=True)
    else:
        write_atomic(out, text)
        typer.echo(f"wrote {out} ({what}); apply: kubectl apply -f {out}", err=True)
