"""How the CLI talks to a person: one console pair, and one way to report a user error.

Every verb is wrapped in `user_errors`: an `HptError` (anywhere below) prints as

    error (invalid spec): spec.yaml: 2 problem(s)
      - sweep.widths: widths must be strictly increasing ... (got [64, 32])

on stderr and exits with status 2; no traceback. A run stopped on purpose (`Stopped`: SIGTERM)
prints its line and exits 75 (retryable). Text from files and flags is printed without Rich
markup, so a study named `[/red]` prints as itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NoReturn, TypeVar

import typer
from rich.console import Console

from hptransfer.errors import HptError, Stopped

# soft_wrap: a long line stays one line in CI logs and pipes (Rich would wrap at 80 columns there).
console = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable)


def report_error(e: HptError) -> None:
    err.print(f"[bold red]error[/] ({e.kind}): ", end="")
    err.print(str(e), markup=False, soft_wrap=True)


def fail(message: str, *, where: str = "", fix: str = "") -> NoReturn:
    """A user error from the CLI layer itself (a bad flag combination)."""
    from hptransfer.errors import Problem

    raise HptError("command line", [Problem(where, message, fix=fix)]) if where else HptError(message)


def user_errors(fn: F) -> F:
    """Map any `HptError` raised by a verb to the one format and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except HptError as e:
            report_error(e)
            raise typer.Exit(2) from None
        except Stopped as e:  # preempted: no traceback, a status a job scheduler retries
            err.print("[bold yellow]stopped[/]: ", end="")
            err.print(str(e), markup=False, soft_wrap=True)
            raise typer.Exit(e.exit_code) from None

    return wrapper  # type: ignore[return-value]


def say(text: str) -> None:
    """Print text that may come from a file or a flag (no markup interpretation)."""
    console.print(text, markup=False)
