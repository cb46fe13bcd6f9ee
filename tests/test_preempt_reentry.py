"""A SIGTERM that lands while the main thread is inside a log stream's write must not log from the
signal handler: that re-enters the stream (CI saw "RuntimeError: reentrant call inside
BufferedWriter … hpt.log" and a traceback in the coordinate check's SIGTERM test). The stream here
sends the signal from inside its own flush and records any write that arrives before it returns."""

from __future__ import annotations

import io
import logging
import os
import signal

import pytest

from hptransfer import preempt


class SignallingStream(io.StringIO):
    """Sends SIGTERM to this process from inside its first flush; notes a write inside any flush."""

    def __init__(self):
        super().__init__()
        self.in_flush, self.reentered, self.sent = False, [], False

    def write(self, s):
        if self.in_flush:
            self.reentered.append(s)
        return super().write(s)

    def flush(self):
        self.in_flush = True
        try:
            if not self.sent:
                self.sent = True
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # Python runs the handler between these bytecodes
                    pass
        finally:
            self.in_flush = False


@pytest.fixture
def logger():
    stream = SignallingStream()
    handler = logging.StreamHandler(stream)
    log = logging.getLogger("test-preempt-reentry")
    log.propagate, log.level = False, logging.INFO
    log.addHandler(handler)
    yield log, stream
    log.removeHandler(handler)


def test_sigterm_inside_a_log_write_is_announced_after_it_not_inside_it(logger):
    log, stream = logger
    with preempt.watch("coordinate check", log=log.info) as w:
        log.info("a progress line")  # its flush sends the SIGTERM
        assert w.requested  # the flag is set inside the handler, at once
        with pytest.raises(preempt.StagePreempted, match="stopped on SIGTERM before width 64"):
            w.check("before width 64")
    assert stream.sent
    assert stream.reentered == []  # nothing written while the stream was mid-flush
    assert "coordinate check: SIGTERM: stopping at the next boundary" in stream.getvalue()  # and the line is there
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back


def test_the_old_way_reenters_the_stream(logger):
    """The stream above catches the bug it is there for: a handler that logs inside the signal."""
    log, stream = logger
    previous = signal.signal(signal.SIGTERM, lambda *_: log.info("logged from the handler"))
    try:
        log.info("a progress line")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stream.reentered and "logged from the handler" in stream.reentered[0]
