"""What a large run is made of, in the spirit of torchtune's recipes: one driver (`train/runner.py`)
and one worker loop (`train/loop.py`) for every run, and a recipe per kind of run that says how to
set it up, take a step, checkpoint and save.

- `Launch`: the recipe's part on the driver, computed before anything is written (a bad plan fails
  there): what is logged to MLflow, printed, written beside the plan, and handed to the workers.
- `Recipe`: the recipe's part in each Ray Train worker, called by the loop in this order:
  `setup` (once, with the restored checkpoint if any) → per step `stop_before`, `step`, sometimes
  `evaluate` and `save_checkpoint` → `finish` → `save` → `check`.

The recipes: `train/plain.py` (the plain large run: a DeepSpeed engine) and `train/private.py`
(the `dp` plan's private run: Opacus DPDDP, with its own Poisson sampler, optimizer wrapper and
accountant).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol


@dataclass(frozen=True)
class Launch:
    """A recipe's part on the driver, built from a plan that passed the recipe's checks."""

    recipe: str  # the worker's recipe, a key of `loop.RECIPES`
    announce: str  # the line the driver prints before the run starts
    params: dict[str, Any]  # MLflow parameters beyond those every run logs (`runner.run_params`)
    tags: dict[str, str] = field(default_factory=dict)  # MLflow tags beyond `rule`
    loop_config: dict[str, Any] = field(default_factory=dict)  # extra keys the workers read
    files: dict[str, Any] = field(default_factory=dict)  # JSON written before the run (and logged), by TrainPaths name
    check_resume: Callable[[Path], None] | None = None  # a resume's own check against the previous plan's file
    summary: Callable[[dict], str] | None = None  # a line printed after the run, from the final metrics


class StepResult(NamedTuple):
    """One optimizer step, as every rank reports it (the loss already averaged across ranks)."""

    train_loss: float
    tokens: int  # tokens this step trained on, all ranks together
    extra: dict[str, Any]  # the recipe's own metrics of this step (they join the step's history row)


class Recipe(Protocol):
    """A recipe's part in one Ray Train worker (`loop.train_loop_per_worker` drives it)."""

    flush_keys: tuple[str, ...]  # metrics that go to MLflow as soon as a step has them (ε spent)

    def setup(self, restored: Path | None) -> dict[str, Any]:
        """Build the model, optimizer and data on the worker's device; load `restored` (the folder
        of Ray Train's latest checkpoint) when given. Returns that checkpoint's client state:
        `step` and `history` ({} for a fresh run)."""

    def lr_factor(self, step: int) -> float:
        """The schedule's factor on the peak learning rate before optimizer step `step + 1`."""

    def stop_before(self, step: int) -> str | None:
        """A status that ends the run before `step` is taken, or None to take it."""

    def step(self, step: int) -> StepResult:
        """One optimizer step of the global batch of `step` (a collective)."""

    def evaluate(self) -> float | None:
        """Validation loss of the current model (None on ranks that do not evaluate)."""

    def save_checkpoint(self, folder: Path, client: dict[str, Any]) -> None:
        """Save the whole state with `client` (step, history) into `folder`, on this rank's part;
        rank 0's folder is what Ray Train keeps."""

    def finish(self, final: dict[str, Any]) -> dict[str, Any]:
        """The run's final metrics: `final` (the last step's metrics, status, times) plus the
        recipe's own, possibly with another status."""

    def save(self, final: dict[str, Any], history: list[dict]) -> None:
        """Write train_metrics.json and the hand-off (rank 0; every rank enters: may be a collective)."""

    def check(self, final: dict[str, Any]) -> None:
        """Raise, after the final report, if the run broke what it promised (private: ε)."""
