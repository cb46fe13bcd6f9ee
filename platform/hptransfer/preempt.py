"""SIGTERM (preemption: a pod evicted, a job cancelled) outside the large run: the coordinate check
and the sweeps stop at a boundary they can resume from and exit 75 (errors.EXIT_RETRYABLE), so the
scheduler's retry — or the user's same command — continues. The large run has its own handler
(train/runner.py: stop_on_sigterm), which stops its workers at a step boundary after a checkpoint.

- Coordinate check: stops before the next width's model (nothing is kept: it is seconds long and
  is run again whole).
- Sweep: Ray Tune's own interrupt (the handler Tune installs for SIGUSR1 while `Tuner.fit` runs),
  which stops the trials, writes Tune's experiment state and returns; finished trials are kept and
  `Tuner.restore` runs the unfinished ones again. Tune handles SIGINT and SIGUSR1 itself but not
  SIGTERM, which would kill the driver mid-write (exit 143)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

from hptransfer.errors import Stopped


class StagePreempted(Stopped):
    """A stage stopped on SIGTERM at a boundary it resumes from; the same command continues (exit 75)."""


class SigtermWatch:
    """Whether SIGTERM came while `watch` was open, and what to do at once when it comes."""

    def __init__(self, stage: str):
        self.stage, self.at, self._forwarded = stage, None, False
        self._announce: threading.Thread | None = None

    @property
    def requested(self) -> bool:
        return self.at is not None

    def check(self, where: str) -> None:
        """At a boundary: raise StagePreempted when SIGTERM came."""
        if self.requested:
            self.settle()
            raise StagePreempted(f"the {self.stage} stopped on SIGTERM {where}; run the same command again to continue")

    def settle(self) -> None:
        """Wait for the SIGTERM line that the handler left to a thread."""
        if self._announce is not None:
            self._announce.join(timeout=10)

    def forward_to_tune(self) -> bool:
        """Hand the stop to Ray Tune's interrupt handler (installed for SIGUSR1 while Tuner.fit runs),
        once, from the main thread (Tune's handler calls `signal.signal`): `TuneForwarder` at Tune's
        next step. False while none is installed."""
        if self._forwarded:
            return True
        handler = signal.getsignal(signal.SIGUSR1)
        if not callable(handler):
            return False
        self._forwarded = True
        handler(signal.SIGUSR1, None)
        return True


_CURRENT: list[SigtermWatch] = []  # the open watches, innermost last


def log_later(log, line: str) -> threading.Thread:
    """Write `line` from a thread: for a signal handler, which may have interrupted the main thread
    inside a log handler's write or flush, where logging again re-enters that stream ("reentrant
    call inside BufferedWriter"). The thread waits for the handler's lock like any other writer."""
    t = threading.Thread(target=log, args=(line,), name="hpt-sigterm", daemon=True)
    t.start()
    return t


def forward_pending() -> None:
    """Hand a pending SIGTERM to Tune: from its step callback, in the main thread, outside the signal."""
    if _CURRENT and _CURRENT[-1].requested:
        _CURRENT[-1].forward_to_tune()


def tune_forwarder():
    """A Ray Tune callback calling `forward_pending` at each of Tune's steps. It finds the open watch
    when it runs (an import, not a captured object): Tune pickles its callbacks into the experiment
    and `Tuner.restore` brings them back in a new process."""
    from ray.tune import Callback

    class TuneForwarder(Callback):
        def on_step_begin(self, iteration, trials, **info):
            from hptransfer import preempt

            preempt.forward_pending()

    return TuneForwarder()


@contextlib.contextmanager
def watch(stage: str, log=print):
    """SIGTERM while the block runs sets the watch (a sweep's `TuneForwarder` then interrupts Tune); the
    previous handler is restored after. In the main thread only (Python delivers signals there);
    elsewhere the block runs unwatched."""
    w = SigtermWatch(stage)
    if threading.current_thread() is not threading.main_thread():
        yield w
        return

    def handler(signum, frame):
        # Only the flag here, the line from a thread (`log_later`; `check` waits for it); Tune's
        # interrupt, which logs too and must run in the main thread, is called by `TuneForwarder`
        # at Tune's next step.
        if w.requested:
            return
        w.at = time.time()
        w._announce = log_later(log, f"{stage}: SIGTERM: stopping at the next boundary it can resume from")

    previous = signal.signal(signal.SIGTERM, handler)
    _CURRENT.append(w)
    try:
        yield w
    finally:
        _CURRENT.remove(w)
        signal.signal(signal.SIGTERM, previous)
