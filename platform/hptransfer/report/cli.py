"""`hpt report STUDY_DIR`: a thin Typer wrapper over `write_report`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hptransfer.console import console, user_errors


@user_errors
def report(
    study_dir: Path = typer.Argument(..., help="Study folder (holds spec.yaml; see `hpt run`)."),
    tracking_uri: Optional[str] = typer.Option(
        None,
        "--tracking-uri",
        help="Log the report as artifacts of the study's MLflow sweep run at this URI "
        "(e.g. sqlite:///STUDY_DIR/mlflow.db or an `mlflow server` URL). Default: not logged.",
    ),
) -> None:
    """Write STUDY_DIR/report/index.html: the µTransfer plot, optimum against width, coordinate
    check, diagnostics and warnings, and the DP noise table when the spec has a `dp:` block."""
    from hptransfer.context import StudyContext
    from hptransfer.report.html import write_report

    # Not `pipeline.report_stage`: this verb takes no lock (a report of a study still running is
    # allowed) and logs to MLflow only when --tracking-uri is given.
    study = StudyContext.from_dir(study_dir)  # a clear StudyError when the folder is not a study
    index = write_report(study.root, tracking_uri, log=lambda m: console.print(m, style="yellow", markup=False))
    console.print(f"report: {index}", markup=False)
    console.print(f"open:   file://{index.resolve()}", markup=False)
