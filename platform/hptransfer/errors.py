"""One error family for every mistake a user can fix: a list of problems, each saying where, what,
the bad value and the fix. The CLI turns any `HptError` into exit status 2 in one format (no
traceback); Python callers catch `HptError` or the stage's subclass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

UNSET: Any = type("Unset", (), {"__repr__": lambda self: "<unset>"})()


@dataclass(frozen=True)
class Problem:
    where: str  # a YAML path (`sweep.grid.lr`), a column, a flag or a file; "" for the whole input
    what: str  # what is wrong, with the allowed values
    value: Any = UNSET  # the bad value, when there is one
    fix: str = ""  # what to do about it

    def __str__(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.value is not UNSET:
            got = repr(self.value)  # a 40,000-value grid or a whole plan block: show its start
            text += f" (got {got if len(got) <= 300 else got[:300] + f' … ({len(got):,} characters)'})"
        return text + (f"; {self.fix}" if self.fix else "")

    # (where, what, value) unpacking and substring tests, as the spec's tuples allowed before.
    def __iter__(self):
        return iter((self.where, self.what, None if self.value is UNSET else self.value))

    def __contains__(self, text: str) -> bool:
        return text in str(self)


class HptError(Exception):
    """A user error. `HptError("one message")` or `HptError(source, [problems...])`."""

    kind = "error"

    def __init__(self, source: str, problems: list[Problem | str | tuple] | None = None):
        self.source = source
        if problems is None:
            self.problems = [Problem("", source)]
            super().__init__(source)
            return
        self.problems = [_problem(p) for p in problems]
        lines = [f"{source}: {len(self.problems)} problem(s)"] + [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


def _problem(p: Problem | str | tuple) -> Problem:
    if isinstance(p, Problem):
        return p
    if isinstance(p, tuple):  # (where, what, value) as pydantic validation yields them
        return Problem(*p)
    return Problem("", str(p))


def problems_from_validation(err, *, prefix: str = "", allowed_keys=None) -> list[Problem]:
    """pydantic's ValidationError → problems with dotted paths (`sweep.widths`, `grid[2]`).

    `allowed_keys(loc)` may list the keys allowed where an unknown key was found."""
    out = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            keys = allowed_keys(e["loc"]) if allowed_keys else []
            msg = f"unknown key (typo?); allowed here: {', '.join(keys) or '(none)'}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        out.append(Problem(dotted(prefix, e["loc"]), msg, e.get("input", UNSET) if e["type"] != "missing" else UNSET))
    return out


def dotted(prefix: str, loc: tuple) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class SpecError(HptError):
    kind = "invalid spec"


class ResultsError(HptError):
    kind = "unusable results"


class PlanError(HptError):
    kind = "invalid plan"


class SweepError(HptError):
    kind = "sweep refused"


class StudyError(HptError):
    kind = "study"


class DPError(HptError):
    kind = "DP budget"


class DataError(HptError):
    """The data stage's user error: each problem names the file (or the spec field) and the fix."""

    kind = "unusable data"


EXIT_RETRYABLE = 75  # sysexits' EX_TEMPFAIL: a temporary stop; resubmitting the same command continues


class Stopped(Exception):
    """Not a mistake to fix: the run stopped (preemption: SIGTERM; workers or nodes lost) and its state is kept.
    The CLI prints the message and exits with EXIT_RETRYABLE, so a scheduler that retries failed
    jobs (a RayJob's backoffLimit, a Job's podFailurePolicy on exit code 75) resubmits it."""

    exit_code = EXIT_RETRYABLE
