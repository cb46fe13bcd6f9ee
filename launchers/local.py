#!/usr/bin/env python
"""Run a study on this machine with the embedded defaults (local Ray, MLflow on SQLite in the
study folder, DeepSpeed on CPU):

    python launchers/local.py search_spaces/quickstart.yaml [--study-dir studies/quickstart] [--verbose] [--dry-run]

Exactly `hpt [--verbose] run SPEC --study-dir DIR`, in this process.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(add_completion=False, pretty_exceptions_show_locals=False)


def hpt_args(spec: Path, study_dir: Path | None, tracking_uri: str | None, verbose: bool = False) -> list[str]:
    from hptransfer.layout import STUDIES_ROOT
    from hptransfer.spec import load_spec

    # The study folder is named by the spec's `name` (as `hpt run` does), not by its file name.
    args = ["--verbose"] * verbose + ["run", str(spec), "--study-dir", str(study_dir or STUDIES_ROOT / load_spec(spec).name)]
    if tracking_uri:
        args += ["--tracking-uri", tracking_uri]
    return args


@app.command()
def main(
    spec: Annotated[Path, typer.Argument(metavar="SPEC", exists=True, dir_okay=False, help="Study spec YAML.")],
    study_dir: Annotated[Optional[Path], typer.Option(help="Study folder; default studies/<spec name>.")] = None,
    tracking_uri: Annotated[Optional[str], typer.Option(help="MLflow server; default SQLite in the study folder.")] = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Ray, Ray Train, DeepSpeed and MLflow output on the console too (hpt --verbose)."),
    ] = False,
    dry_run: Annotated[bool, typer.Option(help="Print the hpt command and stop.")] = False,
) -> None:
    args = hpt_args(spec, study_dir, tracking_uri, verbose)
    typer.echo("hpt " + shlex.join(args), err=True)
    if dry_run:
        return
    from hptransfer.cli import app as hpt

    hpt(args=args, prog_name="hpt")


if __name__ == "__main__":
    app()
