"""What reaches the console and what only the study's log file (`<study>/hpt.log`).

Quiet by default: the console shows our own lines (stage lines, `[sweep i/n]`, `train step N/M`)
and errors; everything the libraries say goes to the log file, where it arises:

- **Output of Ray workers and actors** (Ray Train's controller and `PlacementGroupCleaner`, Ray
  Train's `TrainingReport(...)` dumps, DeepSpeed's accelerator banner, `deepspeed_shm_comm_op built`
  and info logs, torch `FutureWarning`s in the workers). Ray streams every worker's stdout and
  stderr to the driver (`log_to_driver=True`), where one printer writes them to the console. We put
  `route_worker_output` in that printer's place (`attach_ray`): every line goes to the log file
  prefixed by its process as Ray would print it, and to the console (without ANSI colours) only
  under `--verbose`; lines from the raylet (a worker killed for memory, a node lost) and the
  autoscaler's warnings stay on the console. Routing the stream, rather than lowering each
  library's verbosity or ignoring warnings inside the workers, keeps every line in the log file
  (where a failure is diagnosed) and also covers the workers of a remote cluster.
- **Python logging in the driver** goes through the root logger, which writes to the file and shows
  only errors: Ray's `ray` logger (e.g. the token-authentication warning of `ray.init`) is handed
  over to it, and MLflow installs no handler of its own (`MLFLOW_CONFIGURE_LOGGING=false`, env.py),
  so `Creating initial MLflow database tables` reaches it too.

The large run's progress does not ride on the worker stream (which lags, and stops at
`ray.shutdown`): rank 0 appends its lines to `train/progress.log` and the driver prints them
(`follow`), all of them and in order, however fast the steps are.

`set_verbose(True)` (`hpt --verbose`) brings everything back to the console.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from hptransfer.console import console

FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_PRINTER = "ray_print_logs"  # the name Ray gives its worker-output printer on the stream dispatcher
_OURS = "hpt_route_worker_output"

_state: dict = {"verbose": False, "file": None, "console": None}
_workers = logging.getLogger("hpt.workers")  # worker output: file only (printed by us when verbose)
_progress = logging.getLogger("hpt.progress")  # our own lines: file (the console gets them directly)
for _lg in (_workers, _progress):
    _lg.propagate = False
    _lg.setLevel(logging.INFO)


def set_verbose(verbose: bool) -> None:
    _state["verbose"] = bool(verbose)
    if _state["console"] is not None:
        _state["console"].setLevel(logging.INFO if verbose else logging.ERROR)


def is_verbose() -> bool:
    return _state["verbose"]


def attach(log_file: str | Path) -> Path:
    """Send Python logging of this process to `log_file` (appended); only errors also to the console
    (everything under verbose). Idempotent; a second study in the same process moves the file
    handler to its own file."""
    log_file = Path(log_file).resolve()
    old = _state["file"]
    if old is None or Path(old.baseFilename) != log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file, encoding="utf-8")
        handler.setFormatter(logging.Formatter(FILE_FORMAT))
        for lg in (logging.getLogger(), _workers, _progress):
            if old is not None:
                lg.removeHandler(old)
            lg.addHandler(handler)
        if old is not None:
            old.close()
        _state["file"] = handler
    root = logging.getLogger()
    root.setLevel(min(root.level or logging.WARNING, logging.INFO))
    if _state["console"] is None:
        con = logging.StreamHandler(sys.stderr)
        con.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(con)
        _state["console"] = con
        set_verbose(_state["verbose"])
    _adopt_ray_logger()
    _quiet_libraries()
    return log_file


class _FileUnlessVerbose(logging.Filter):
    """On a library logger with its own console handler: the record goes to our log file, and on to
    the library's handler only under verbose (or when it is an error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _state["verbose"]:
            return True
        handler = _state["file"]
        if handler is not None and record.levelno >= handler.level:
            handler.handle(record)
        return record.levelno >= logging.ERROR


def _quiet_libraries() -> None:
    """What libraries print in the driver itself (not through Ray's worker stream), to the log file:

    - DeepSpeed's `DeepSpeed` logger has its own stdout handler and does not propagate (`Setting
      accelerator to CPU`): a filter on the logger (made before DeepSpeed makes it, or after; the
      object is the same) sends its records to our file instead;
    - `warnings.warn` (Megatron's `Apex is not installed`, its UserWarnings) go through logging
      (`py.warnings`) to the root logger, hence the file;
    - the `transformers` / `huggingface_hub` progress bars (`Writing model shards`) are off unless
      verbose; they say nothing the stage's own line does not."""
    ds = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _FileUnlessVerbose) for f in ds.filters):
        ds.addFilter(_FileUnlessVerbose())
    logging.captureWarnings(True)
    if _state["verbose"]:
        return
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils.logging import disable_progress_bar

        disable_progress_bar()


def _adopt_ray_logger() -> None:
    """Ray's `ray` logger prints through its own handler and does not propagate: hand it to the
    root logger's file and console handlers instead (what Ray's own `clear_logger` does). Its
    handler is made when Ray is imported, so this runs again once Ray is."""
    if "ray" in sys.modules:
        ray_logger = logging.getLogger("ray")
        ray_logger.handlers.clear()
        ray_logger.propagate = True


# --- Ray workers' output -----------------------------------------------------------------------


def _prefix(data: dict) -> str:
    pid = data.get("pid")
    if pid in ("raylet", "autoscaler"):
        return f"({pid}) "
    name = data.get("actor_name") or data.get("task_name")
    return f"({name} pid={pid}) " if name else f"(pid={pid}) "


def route_worker_output(data: dict) -> None:
    """One batch of a worker's stdout or stderr lines, as Ray's log monitor publishes them. Like
    Ray's own printer, only the autoscaler's events are kept of its output (not its status dumps).
    Runs on Ray's log thread: it must never raise there (that would end the thread)."""
    try:
        _route(data)
    except Exception:  # keep Ray's log thread alive whatever a line holds
        logging.getLogger(__name__).exception("could not route a batch of Ray worker output")


def _route(data: dict) -> None:
    prefix = _prefix(data)
    lines = data.get("lines", [])
    if data.get("pid") == "autoscaler":
        from ray._private.worker import filter_autoscaler_events

        lines = list(filter_autoscaler_events(lines))
    lines = [_ANSI.sub("", line) for line in lines]
    for line in lines:
        _workers.info("%s%s", prefix, line)
    if not _state["verbose"]:  # what stays on the console: the raylet (a worker killed, a node lost), autoscaler warnings
        lines = [
            ln
            for ln in lines
            if data.get("pid") == "raylet" or (data.get("pid") == "autoscaler" and ("Warning:" in ln or "Error:" in ln))
        ]
    if lines:
        sink = sys.stderr if data.get("is_err") else sys.stdout
        sink.write("".join(f"{prefix}{line}\n" for line in lines))
        sink.flush()


def attach_ray() -> bool:
    """After `ray.init(log_to_driver=True)`: route worker output through `route_worker_output`
    instead of Ray's printer. False when this Ray has no such dispatcher (then Ray prints as usual)."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:  # pragma: no cover - a Ray without the dispatcher
        logging.getLogger(__name__).warning("cannot route Ray worker output (no stream dispatcher in this Ray)")
        return False
    dispatcher.remove_handler(_RAY_PRINTER)
    dispatcher.remove_handler(_OURS)
    dispatcher.add_handler(_OURS, route_worker_output)
    return True


def detach_ray() -> None:
    with contextlib.suppress(ImportError):
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        dispatcher.remove_handler(_OURS)


# --- our own lines -------------------------------------------------------------------------------


def progress(line: str) -> None:
    """A progress line: on the console as plain text (no wrapping, no markup), and in the log file."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)
    _progress.info("%s", line)


@contextlib.contextmanager
def follow(path: str | Path, on_line: Callable[[str], None] = progress, every_s: float = 0.5) -> Iterator[None]:
    """Print the lines appended to `path` (from its current end) while the block runs, then the
    rest once it ends. The large run's rank 0 appends its progress there."""
    path = Path(path)
    offset = [path.stat().st_size if path.exists() else 0]
    stop = threading.Event()

    def drain() -> None:
        if not path.exists():
            return
        if path.stat().st_size < offset[0]:  # replaced (a restart): read the new file from its start
            offset[0] = 0
        with path.open("rb") as f:
            f.seek(offset[0])
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        offset[0] += len(complete)
        for line in complete.decode("utf-8", "replace").splitlines():
            on_line(line)

    def loop() -> None:
        while not stop.wait(every_s):
            drain()

    thread = threading.Thread(target=loop, name="hpt-follow", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        drain()
