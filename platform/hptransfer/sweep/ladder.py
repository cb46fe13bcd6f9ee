"""The ladder's trials as one Ray Tune run: the grid (widths × seeds × hyperparameter values), and
each width's seed replicates as soon as that width's grid is done.

The replicates rerun a width's best grid point (seed-averaged loss) with new seeds: they measure
the sweep's own loss noise, which the transfer engine's intervals need. Which point they rerun is
known only once the width's grid has finished, so they cannot be a grid axis; a second Tune run for
them (as before) paid a cold start of every trial process (the quickstart's replicates started 27 s
after its grid ended) and left cores idle while the grid's last trials ran. `LadderSearcher` is a
Tune `Searcher` instead: it hands out grid points first, widest first (longest-processing-time
first, so the last trials to finish are short ones), queues a width's replicates the moment its
last grid trial completes, and says FINISHED when everything was handed out.

Bracketing (issue 37 item 4): a `sweep.axes` arm whose best lr is the lowest or the highest it has
tried gets one lr a grid step beyond (the ratio of the two nearest values tried at that edge), with
the grid's seeds, before its replicates — up to `bracket` times. A law fitted on edge optima fits
bounds, and the axes laws then fall back to their priors in practice; the width ladder's own grid is
left as the user gave it (its edges are warned about by the plan).

Resume: Tune saves the searcher's state (`get_state`) in the same experiment checkpoint as its trial
list, so after a crash both agree; a trial that completed after that checkpoint is re-queued by Tune
and replays its result from its `trials_done/` marker (sweep/trial.py), which reaches
`on_trial_complete` again.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

ARM_KEYS = ("steps", "batch_size", "depth")  # a sweep.axes arm: a width's grid at another horizon, batch or depth


def arm_of(point: dict) -> tuple:
    """The arm a point belongs to: its width and, for a sweep.axes arm, the axis values it sets.
    Replicates follow an arm's own grid (the ladder's arms are plain widths)."""
    return (point["width"], *((k, point[k]) for k in ARM_KEYS if k in point))


def point_key(point: dict) -> str:
    """A trial's identity within the ladder: the point itself (width, tuned values, seed, replicate)."""
    return json.dumps(point, sort_keys=True)


def best_point(rows: list[dict], tuned: list[str]) -> dict | None:
    """The grid point of lowest seed-averaged loss over `rows` (one width's finished grid trials,
    each {tuned values..., "val_loss", "ok"}); None when no trial ended ok."""
    sums: dict[tuple, list[float]] = {}
    for r in rows:
        if r["ok"] and math.isfinite(r["val_loss"]):
            sums.setdefault(tuple(r[k] for k in tuned), []).append(r["val_loss"])
    if not sums:
        return None
    best = min(sums, key=lambda p: sum(sums[p]) / len(sums[p]))
    return dict(zip(tuned, best))


class LadderSearcher(Searcher):
    """Grid points in the given order, then each width's `replicate_seeds` at its best point.

    `grid` is the full list of grid configs (each with "width", "seed" and the tuned values), in
    the order they should start; `width_rank` orders replicates among the remaining grid points (a
    replicate of a wide width goes before the grid points of narrower ones). `ok(result)` says
    whether a finished trial's loss counts (a diverged or failed trial does not)."""

    def __init__(
        self,
        grid: list[dict],
        tuned: list[str],
        replicate_seeds: list[int],
        width_rank: dict[int, int],
        *,
        metric: str = "val_loss",
        mode: str = "min",
        ok=None,
        bracket: int = 0,
        bracket_hp: str = "lr",
        ladder_base: dict | None = None,
    ):
        super().__init__(metric=metric, mode=mode)
        # ladder_base: the width ladder's own steps / batch_size (its points carry them when there are
        # axes arms): an arm that sets another value of one of them is a sweep.axes arm, the one bracketed.
        self.bracket, self.bracket_hp, self.ladder_base = int(bracket), bracket_hp, dict(ladder_base or {})
        self.tuned, self.replicate_seeds, self.width_rank = list(tuned), list(replicate_seeds), dict(width_rank)
        self.ok = ok or (lambda result: result.get("status", "ok") == "ok")
        self.queue: list[dict] = [{**p, "replicate": False} for p in grid]
        self.grid_left: dict[tuple, int] = {}  # arm (arm_of) -> grid trials not yet completed
        for p in grid:
            self.grid_left[arm_of(p)] = self.grid_left.get(arm_of(p), 0) + 1
        self.finished_rows: dict[tuple, list[dict]] = {}  # arm -> its completed grid trials
        self.live: dict[str, dict] = {}  # Tune trial id -> the point it runs
        self.done: set[str] = set()  # point keys completed (a replayed completion is counted once)
        self.arm_seeds: dict[tuple, list[int]] = {}  # arm -> its grid seeds (bracketing reuses them)
        for p in grid:
            seeds = self.arm_seeds.setdefault(arm_of(p), [])
            if p["seed"] not in seeds:
                seeds.append(p["seed"])
        self.extended: dict[tuple, int] = {}  # arm -> bracketing points added so far

    # --- Tune's Searcher interface -----------------------------------------------------------

    def suggest(self, trial_id: str) -> dict | str | None:
        if self.queue:
            point = self.queue.pop(0)
            self.live[trial_id] = point
            return dict(point)
        if self.live or any(self.grid_left.values()):
            return None  # a width's grid is still running: its replicates are not known yet
        return Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        point = self.live.pop(trial_id, None)
        if point is None:
            return
        key = point_key(point)
        if key in self.done:
            return
        self.done.add(key)
        if point["replicate"]:
            return
        arm = arm_of(point)
        r = result or {}
        val = r.get(self.metric)
        self.finished_rows.setdefault(arm, []).append(
            {
                **{k: point[k] for k in self.tuned},
                "val_loss": float(val) if isinstance(val, (int, float)) else math.nan,
                "ok": not error and bool(r) and self.ok(r),
            }
        )
        self.grid_left[arm] -= 1
        if self.grid_left[arm] == 0 and self._bracket(arm, point):
            return
        if self.grid_left[arm] == 0 and self.replicate_seeds:
            best = best_point(self.finished_rows[arm], self.tuned)
            if best is not None:
                fixed = {k: point[k] for k in ARM_KEYS if k in point}
                self._enqueue(
                    [{"width": point["width"], **fixed, **best, "seed": s, "replicate": True} for s in self.replicate_seeds]
                )

    def _bracket(self, arm: tuple, point: dict) -> bool:
        """A sweep.axes arm (not a plain width) whose best bracket_hp value is an edge of what it tried:
        queue one value a step beyond, at the best point's other values, with the arm's grid seeds.
        True when it did (the arm's replicates wait for those trials)."""
        is_axes_arm = any(point[k] != self.ladder_base.get(k) for k in ARM_KEYS if k in point)
        if not is_axes_arm or self.extended.get(arm, 0) >= self.bracket or self.bracket_hp not in self.tuned:
            return False
        best = best_point(self.finished_rows[arm], self.tuned)
        tried = sorted({float(r[self.bracket_hp]) for r in self.finished_rows[arm]})  # ok or not
        if best is None or len(tried) < 2:
            return False
        v = float(best[self.bracket_hp])
        if v == tried[0]:
            new = v * v / tried[1]  # the step between the two lowest values, once more downwards
        elif v == tried[-1]:
            new = v * v / tried[-2]
        else:
            return False
        fixed = {k: point[k] for k in ARM_KEYS if k in point}
        points = [
            {"width": point["width"], **fixed, **best, self.bracket_hp: new, "seed": s, "replicate": False}
            for s in self.arm_seeds[arm]
        ]
        self.extended[arm] = self.extended.get(arm, 0) + 1
        self.grid_left[arm] += len(points)
        self._enqueue(points)
        return True

    def _enqueue(self, points: list[dict]) -> None:
        """Insert before the first queued point of a narrower width (in `width_rank`), so the
        widest work still starts first."""
        rank = self.width_rank[points[0]["width"]]
        at = next((i for i, q in enumerate(self.queue) if self.width_rank[q["width"]] > rank), len(self.queue))
        self.queue[at:at] = points

    # --- state, for Tune's experiment checkpoints --------------------------------------------

    _STATE = ("queue", "grid_left", "finished_rows", "live", "done", "extended")

    def get_state(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._STATE}

    def set_state(self, state: dict[str, Any]) -> None:
        for k in self._STATE:
            if k in state:  # a state saved before bracketing existed has no `extended`
                setattr(self, k, state[k])

    def save(self, checkpoint_path: str) -> None:
        Path(checkpoint_path).write_bytes(pickle.dumps(self.get_state()))

    def restore(self, checkpoint_path: str) -> None:
        self.set_state(pickle.loads(Path(checkpoint_path).read_bytes()))
