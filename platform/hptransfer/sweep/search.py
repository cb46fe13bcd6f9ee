"""`sweep.search: optuna`: a model-based search per width through Ray Tune's own Optuna integration
(`ray.tune.search.optuna.OptunaSearch`, Optuna's TPE sampler), in the same Tune run, with the same
replicates, resume, progress and failures-as-data as the grid (sweep/ladder.py).

Each width (arm) gets its own Optuna study over the box `sweep.grid` gives (each tunable's
[low, high], sampled on the scale `Hyperparameters` declares: log for the LR, linear for warmup), a
budget of `sweep.optuna.trials_per_width` trials, and, once its budget has completed, the
`noise_seeds` replicates at its best point — `LadderSearcher` with Optuna handing out the points
instead of a fixed list. Width is never a searched dimension: µP's claim is that the optimum is the
same at every width, and a searcher over width would spend the budget on the widest model (lowest
loss), not on the hyperparameters.

What the sampler is told: an ok trial's `val_loss`; a diverged one the worst loss its width has
seen so far (divergence is information: "too high", as the grid's fit treats it; Optuna would drop
a NaN); a failed one FAIL (no information); an early-stopped (ASHA) one PRUNED. The table records
every trial as it ended, as for the grid.

Concurrency: `max_concurrent` trials at once, counted in this searcher's own state (`live`), not by
Tune's `ConcurrencyLimiter`, whose running-trial set is not in the experiment checkpoint (Ray 2.60:
its save/restore delegate to the wrapped searcher), so after a resume it would drop the completions
of trials that were running at the crash. TPE learns from completed trials only: the fewer run at
once, the more each suggestion knows.
"""

from __future__ import annotations

import math
from typing import Any

from ray.tune.search import Searcher

from hptransfer.sweep.ladder import LadderSearcher, arm_of


def optuna_space(box: dict[str, list[float]], log_scale: set[str] | frozenset[str]) -> dict[str, Any]:
    """Optuna distributions for the box: each tunable's [low, high] on its declared scale."""
    from optuna.distributions import FloatDistribution

    return {hp: FloatDistribution(float(lo), float(hi), log=hp in log_scale) for hp, (lo, hi) in box.items()}


class OptunaLadderSearcher(LadderSearcher):
    """Per arm, `budget` points from that arm's OptunaSearch (TPE); then the arm's replicates.

    arms: the width ladder's points without hyperparameters ({"width": w}), in the order their work
    starts (widest first); seed: every searched trial's seed (replicates get their own)."""

    def __init__(
        self,
        arms: list[dict],
        box: dict[str, list[float]],
        log_scale,
        budget: int,
        seed: int,
        replicate_seeds: list[int],
        width_rank: dict[int, int],
        *,
        max_concurrent: int,
        sampler_seed: int = 0,
        startup_trials: int = 8,
        metric: str = "val_loss",
        mode: str = "min",
        ok=None,
        status=None,
    ):
        import optuna
        from optuna.samplers import TPESampler
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per trial is the sweep's progress line's job

        super().__init__([], list(box), replicate_seeds, width_rank, metric=metric, mode=mode, ok=ok)
        self.arms, self.budget, self.seed, self.max_concurrent = [dict(a) for a in arms], budget, seed, max_concurrent
        self.status = status or (lambda result: result.get("status", "ok"))
        self.handed = [0] * len(self.arms)
        self.grid_left = {arm_of(a): budget for a in self.arms}
        space = optuna_space(box, log_scale)
        self.studies = [
            OptunaSearch(
                space=space,
                metric=metric,
                mode=mode,
                sampler=TPESampler(seed=sampler_seed + i, n_startup_trials=min(startup_trials, budget)),
            )
            for i in range(len(self.arms))
        ]
        self.arm_of_trial: dict[str, int] = {}
        self.worst: dict[int, float] = {}  # arm → its worst ok loss so far (what a diverged trial is told)

    def suggest(self, trial_id: str) -> dict | str | None:
        if len(self.live) >= self.max_concurrent:
            return None
        if self.queue:  # a finished arm's replicates first (widest first, as LadderSearcher queues them)
            return super().suggest(trial_id)
        left = [i for i in range(len(self.arms)) if self.handed[i] < self.budget]
        if left:
            # The arm with the fewest handed out (ties: the widest): each arm's sampler sees as many
            # completed trials as the concurrency allows before its next suggestion.
            i = min(left, key=lambda j: (self.handed[j], j))
            self.handed[i] += 1
            self.arm_of_trial[trial_id] = i
            point = {**self.arms[i], **self.studies[i].suggest(trial_id), "seed": self.seed, "replicate": False}
            self.live[trial_id] = point
            return dict(point)
        if self.live or any(self.grid_left.values()):
            return None
        return Searcher.FINISHED

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        i = self.arm_of_trial.pop(trial_id, None)
        if i is not None and trial_id in self.live:
            self._tell(i, trial_id, result, error)
        super().on_trial_complete(trial_id, result, error)

    def _tell(self, i: int, trial_id: str, result: dict | None, error: bool) -> None:
        r = result or {}
        status = "failed" if error or not r else self.status(r)
        value = r.get(self.metric)
        if status == "ok" and isinstance(value, (int, float)) and math.isfinite(value):
            self.worst[i] = max(self.worst.get(i, -math.inf), float(value))
            self.studies[i].on_trial_complete(trial_id, {self.metric: float(value)})
        elif status == "diverged" and i in self.worst:
            self.studies[i].on_trial_complete(trial_id, {self.metric: self.worst[i]})
        elif status == "stopped":
            self.studies[i].on_trial_complete(trial_id, None, error=False)  # PRUNED
        else:
            self.studies[i].on_trial_complete(trial_id, None, error=True)  # FAIL

    _STATE = (*LadderSearcher._STATE, "handed", "studies", "arm_of_trial", "worst")
