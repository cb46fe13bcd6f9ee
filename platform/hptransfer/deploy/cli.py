"""`hpt k8s ...`: Kubernetes (KubeRay) commands."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError

from hptransfer.deploy.render import RayJobRequest, render_rayjob, spec_in_image, to_yaml

app = typer.Typer(help="Kubernetes (KubeRay) manifests for a study.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Kubernetes (KubeRay) manifests for a study."""  # keeps `render` a sub-command

# pydantic field -> the flag a user types, so errors name what to change.
_FLAGS = {
    "spec": "SPEC", "image": "--image", "namespace": "--namespace", "name": "--name",
    "workers": "--workers", "gpus_per_worker": "--gpus-per-worker",
    "cpus_per_worker": "--cpus-per-worker", "memory_per_worker": "--memory-per-worker",
    "tracking_uri": "--tracking-uri",
}


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def request_from_flags(spec: Path, **flags: object) -> RayJobRequest:
    """Build the request, raising typer.BadParameter with *every* problem named by its flag."""
    problems: list[str] = []
    in_image = str(spec)
    if not spec.is_file():
        problems.append(f"SPEC: no such file {str(spec)!r}")
    else:
        try:
            in_image = spec_in_image(str(spec))
        except ValueError as e:
            problems.append(f"SPEC: {e}")
    try:
        req = RayJobRequest(spec=in_image, **{k: v for k, v in flags.items() if v is not None})
    except ValidationError as e:
        for err in e.errors():
            field = str(err["loc"][0]) if err["loc"] else ""
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
    spec: Annotated[Path, typer.Argument(metavar="SPEC", help="Study spec YAML in the project's search_spaces/.")],
    image: Annotated[str, typer.Option(help="Image built from the repo's Dockerfile.")] = "hptransfer",
    namespace: Annotated[str, typer.Option(help="Namespace with the mlflow Service, hpt-studies PVC.")] = "hptransfer",
    workers: Annotated[int, typer.Option(help="Ray worker pods.")] = 1,
    gpus_per_worker: Annotated[int, typer.Option(help="nvidia.com/gpu per worker (0: CPU workers).")] = 0,
    cpus_per_worker: Annotated[str, typer.Option(help="CPU per worker (Kubernetes quantity).")] = "2",
    memory_per_worker: Annotated[str, typer.Option(help="Memory per worker (Kubernetes quantity).")] = "4Gi",
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow URI; default the mlflow Service.")] = None,
    name: Annotated[Optional[str], typer.Option(help="RayJob name; default hpt-<spec stem>.")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Write here instead of stdout.")] = None,
) -> None:
    """Render a KubeRay RayJob that runs `hpt run SPEC` (apply it with `kubectl apply -f`)."""
    req = request_from_flags(
        spec, image=image, namespace=namespace, workers=workers, gpus_per_worker=gpus_per_worker,
        cpus_per_worker=cpus_per_worker, memory_per_worker=memory_per_worker,
        tracking_uri=tracking_uri, name=name,
    )
    text = to_yaml(render_rayjob(req))
    if out is None:
        typer.echo(text, nl=False)
    else:
        write_atomic(out, text)
        typer.echo(f"wrote {out} (RayJob {req.namespace}/{req.job_name}); apply: kubectl apply -f {out}", err=True)
