"""The large run's progress, kept by rank 0 (a no-op on the other ranks).

- A plain line at least every 10% of the steps, at the last step and at every evaluation:
  `train step 80/160  loss 2.3512  val 2.4107  tok/s 1918  ETA 1m05s`, appended to
  `train/progress.log`; the driver prints what is appended (`hptransfer.logs.follow`).
- The latest state in `train/progress.json` (step, total, losses, tokens/s, elapsed, ETA, the
  time it was written, the last checkpoint, the status): what `hpt status` shows.

ETA = this session's seconds per step × steps left (a resumed run times only its own steps).
"""

from __future__ import annotations

import time

from hptransfer.io import write_json
from hptransfer.layout import TrainPaths

LINES = 10  # at least this many progress lines per run


def duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    def __init__(self, paths: TrainPaths, total: int, start: int, *, enabled: bool = True):
        self.paths, self.total, self.start, self.enabled = paths, total, start, enabled
        self.every = max(1, total // LINES)
        self.t0 = time.time()
        self.state: dict = {"step": start, "total": total, "status": "running", "started": self.t0, "resumed_from_step": start}
        if enabled and start:
            self.line(f"train: resumed from the checkpoint at step {start}/{total}")

    def line(self, text: str) -> None:
        Progress.say(self.paths, [text], enabled=self.enabled)

    @staticmethod
    def say(paths: TrainPaths, lines: list[str], *, enabled: bool = True) -> None:
        """Append lines to progress.log (the driver prints them), as rank 0."""
        if enabled and lines:
            with paths.progress_log.open("a", encoding="utf-8") as f:
                f.write("".join(t + "\n" for t in lines))

    def _write(self, **fields) -> None:
        if self.enabled:
            self.state.update(fields, time=time.time())
            write_json(self.paths.progress, self.state)

    def step(self, metrics: dict) -> None:
        """After each optimizer step (and its evaluation, if any)."""
        step = metrics["step"]
        evaluated = "val_loss" in metrics
        if not self.enabled or not (step % self.every == 0 or step == self.total or evaluated or step == self.start + 1):
            return
        elapsed = time.time() - self.t0
        eta = elapsed / max(1, step - self.start) * (self.total - step)
        fields = {
            "step": step,
            "train_loss": metrics["train_loss"],
            "tokens_per_s": metrics["tokens_per_s"],
            "elapsed_s": round(elapsed, 2),
            "eta_s": round(eta, 2),
        }
        if evaluated:
            fields.update(val_loss=metrics["val_loss"], val_step=step)
        self.line(
            f"train step {step}/{self.total}  loss {metrics['train_loss']:.4f}"
            + (f"  val {metrics['val_loss']:.4f}" if evaluated else "")
            + f"  tok/s {metrics['tokens_per_s']:.0f}  ETA {duration(eta)}"
        )
        self._write(**fields)

    def checkpoint(self, step: int) -> None:
        self._write(checkpoint_step=step)

    def finish(self, metrics: dict) -> None:
        self._write(
            step=metrics["step"], status=metrics.get("status", "ok"), eta_s=0.0, elapsed_s=round(time.time() - self.t0, 2)
        )
