"""The study report: `write_report(study_dir)` → study_dir/report/index.html (+ PNGs), `hpt report`."""

from hptransfer.report.html import write_report

__all__ = ["write_report"]
