"""`hpt report STUDY_DIR`: a thin Typer wrapper over `write_report`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def report(
    study_dir: Path = typer.Argument(..., help="Study folder (holds spec.yaml; see `hpt run`)."),
    tracking_uri: Optional[str] = typer.Option(
        None, "--tracking-uri",
        help="Log the report as artifacts of the study's MLflow sweep run at this URI "
             "(e.g. sqlite:///STUDY_DIR/mlflow.db or an `mlflow server` URL). Default: not logged."),
) -> None:
    """Write STUDY_DIR/report/index.html: the µTransfer plot, optimum against width, coordinate
    check, diagnostics and warnings, and the DP noise table when the spec has a `dp:` block."""
    from hptransfer.report.html import write_report
    from hptransfer.spec import SpecError

    if not (study_dir / "spec.yaml").is_file():
        err.print(f"[bold red]error:[/] {study_dir} is not a study folder: {study_dir / 'spec.yaml'} is missing; "
                  "pass the folder `hpt run`/`hpt sweep` wrote (default studies/<name>)")
        raise typer.Exit(code=2)
    try:
        index = write_report(study_dir, tracking_uri, log=lambda m: console.print(f"[yellow]{m}[/]"))
    except SpecError as e:
        err.print(f"[bold red]error:[/] {e}")
        raise typer.Exit(code=2)
    console.print(f"report: {index}")
    console.print(f"open:   file://{index.resolve()}")
