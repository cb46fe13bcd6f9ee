"""`sweep.search: optuna`: a model-based search per width through Ray Tune's own Optuna integration
(`ray.tune.search.optuna.OptunaSearch`, Optuna's TPE sampler), in the same Tune run, with the same
replicates, resume, progress and failures-as-data as the grid (sweep/ladder.py).

Each width (arm) gets its own Optuna study over the box `sweep.grid` gives (each tunable's
[low, high], sampled on the scale `Hyperparameters` declares: log for the LR, linear for warmup), a
budget of trials (`spec.OptunaSpec.budgets`: falling with width), and, once its budget has
completed, the `noise_seeds` replicates at its best point — `LadderSearcher` with Optuna handing
out the points instead of a fixed list. Width is never a searched dimension: µP's claim is that the
optimum is the same at every width, and a searcher over width would spend the budget on the widest
model (lowest loss), not on the hyperparameters.

The ladder as fidelity: widths run narrowest first, and each wider width starts from what the
narrower one found — its first trials are the narrower width's best points, then its sampler is
told the narrower width's trials at their loss plus the level offset measured at those shared
points (`level_offset`). The narrow widths are cheap, so most of the search happens there.

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

import json
import math
from typing import Any

from ray.tune.search import Searcher

from hptransfer.sweep.ladder import LadderSearcher, arm_of


def optuna_space(box: dict[str, list[float]], log_scale: set[str] | frozenset[str]) -> dict[str, Any]:
    """Optuna distributions for the box: each tunable's [low, high] on its declared scale."""
    from optuna.distributions import FloatDistribution

    return {hp: FloatDistribution(float(lo), float(hi), log=hp in log_scale) for hp, (lo, hi) in box.items()}


def anchors(rows: list[tuple[dict, float]], k: int) -> list[dict]:
    """The k best points of a narrower width's own ok trials (params, loss): where the next width starts."""
    return [dict(p) for p, _ in sorted(rows, key=lambda r: r[1])[:k]]


def level_offset(pairs: list[tuple[float, float]]) -> float | None:
    """The loss offset between two widths from trials at the same points: median of (wider − narrower)
    over the pairs where both ended ok; None without such a pair.

    µP says the optimum (and the shape of the loss around it) is the same at every width while the
    level falls with width, so a narrower width's trial told to a wider width's study is its loss
    plus this offset. TPE splits trials into good and bad by loss rank: told raw, every narrower
    trial would rank behind every wider one (their losses are higher) and the transferred evidence
    would say "everything the narrow width found is bad". A shift keeps the narrower width's own
    ranking; standardising each width (z-scores) would also rescale it, from a handful of trials."""
    d = sorted(w - n for n, w in pairs if math.isfinite(n) and math.isfinite(w))
    if not d:
        return None
    m = len(d) // 2
    return d[m] if len(d) % 2 else (d[m - 1] + d[m]) / 2


class OptunaLadderSearcher(LadderSearcher):
    """Per arm (narrowest first), `budgets[i]` points from that arm's OptunaSearch (TPE); then the
    arm's replicates.

    The ladder as fidelity (issue 25 item 2): an arm starts once the narrower one has handed out its
    budget. Its first trials are the narrower arm's `warm_start` best points (`points_to_evaluate`:
    enqueued, evaluated at this width); once they have finished, every trial the narrower arm's
    study knows (its own and what it was told) is told to this arm's study
    (`add_evaluated_point`) at its loss plus the offset measured on those shared points
    (`level_offset`), and so are the narrower arm's later completions. TPE then models this width
    from the start, and the budgets fall with width (`budgets`, from spec.OptunaSpec.budgets):
    the ladder's compute goes where it is cheap.

    arms: the width ladder's points without hyperparameters ({"width": w}), narrowest first;
    seed: every searched trial's seed (replicates get their own)."""

    def __init__(
        self,
        arms: list[dict],
        box: dict[str, list[float]],
        log_scale,
        budgets: list[int] | int,
        seed: int,
        replicate_seeds: list[int],
        width_rank: dict[int, int],
        *,
        max_concurrent: int,
        sampler_seed: int = 0,
        startup_trials: int = 8,
        warm_start: int = 3,
        metric: str = "val_loss",
        mode: str = "min",
        ok=None,
        status=None,
    ):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # a line per trial is the sweep's progress line's job

        super().__init__([], list(box), replicate_seeds, width_rank, metric=metric, mode=mode, ok=ok)
        self.arms, self.seed, self.max_concurrent = [dict(a) for a in arms], seed, max_concurrent
        self.budgets = [budgets] * len(self.arms) if isinstance(budgets, int) else list(budgets)
        if len(self.budgets) != len(self.arms):
            raise ValueError(f"{len(self.budgets)} budgets for {len(self.arms)} arms")
        self.status = status or (lambda result: result.get("status", "ok"))
        self.space, self.sampler_seed, self.startup_trials = optuna_space(box, log_scale), sampler_seed, startup_trials
        self.warm_start = warm_start
        self.handed = [0] * len(self.arms)
        self.grid_left = {arm_of(a): b for a, b in zip(self.arms, self.budgets)}
        self.studies: list = [None] * len(self.arms)  # an arm's OptunaSearch, made when the arm starts
        self.arm_of_trial: dict[str, int] = {}
        self.worst: dict[int, float] = {}  # arm → its worst ok loss so far (what a diverged trial is told)
        self.own: list[list] = [[] for _ in self.arms]  # arm → its own ok trials (params, loss)
        self.told: list[list] = [[] for _ in self.arms]  # arm → every (params, value) its study was told a value of
        self.anchor_pts: list[list] = [[] for _ in self.arms]  # arm → the points it started at
        self.anchor_done: list[dict] = [{} for _ in self.arms]  # arm → anchor index → its loss here (nan: not ok)
        self.offset: list = [None] * len(self.arms)  # arm → offset to the narrower arm; "none": no transfer

    # --- which trial next --------------------------------------------------------------------

    def suggest(self, trial_id: str) -> dict | str | None:
        if len(self.live) >= self.max_concurrent:
            return None
        if self.queue:  # a finished arm's replicates first
            return super().suggest(trial_id)
        i = next((j for j in range(len(self.arms)) if self.handed[j] < self.budgets[j]), None)
        if i is not None and self.studies[i] is None and not self._start(i):
            return None  # the narrower arm has too few finished trials to start from yet
        if i is not None and self.handed[i] >= len(self.anchor_pts[i]) and self.offset[i] is None:
            running = len(self.anchor_done[i]) < len(self.anchor_pts[i])
            if running and not any(math.isfinite(v) for v in self.anchor_done[i].values()):
                return None  # no anchor has finished ok: the next point would be a blind one
            self._transfer(i)  # a free slot: go with the anchors finished so far
        if i is not None:
            self.handed[i] += 1
            self.arm_of_trial[trial_id] = i
            point = {**self.arms[i], **self.studies[i].suggest(trial_id), "seed": self.seed, "replicate": False}
            self.live[trial_id] = point
            return dict(point)
        if self.live or any(self.grid_left.values()):
            return None
        return Searcher.FINISHED

    def _start(self, i: int) -> bool:
        """Make arm i's study, warm-started from arm i−1's best finished points; False: wait."""
        from optuna.samplers import TPESampler
        from ray.tune.search.optuna import OptunaSearch

        start: list[dict] = []
        if i > 0 and self.warm_start:
            narrower_running = any(a == i - 1 for a in self.arm_of_trial.values())
            if len(self.own[i - 1]) < min(self.warm_start, self.budgets[i - 1]) and narrower_running:
                return False
            start = anchors(self.own[i - 1], min(self.warm_start, self.budgets[i] - 1))
        self.anchor_pts[i] = start
        if not start:
            self.offset[i] = "none"
        self.studies[i] = OptunaSearch(
            space=self.space,
            metric=self.metric,
            mode=self.mode,
            points_to_evaluate=start or None,  # enqueued: this arm's first trials
            sampler=TPESampler(seed=self.sampler_seed + i, n_startup_trials=min(self.startup_trials, self.budgets[i])),
        )
        return True

    # --- what the samplers are told ----------------------------------------------------------

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        i = self.arm_of_trial.pop(trial_id, None)
        if i is not None and trial_id in self.live:
            self._tell(i, trial_id, self.live[trial_id], result, error)
        super().on_trial_complete(trial_id, result, error)

    def _tell(self, i: int, trial_id: str, point: dict, result: dict | None, error: bool) -> None:
        r = result or {}
        status = "failed" if error or not r else self.status(r)
        value = r.get(self.metric)
        params = {hp: point[hp] for hp in self.space}
        told = None
        if status == "ok" and isinstance(value, (int, float)) and math.isfinite(value):
            told = float(value)
            self.worst[i] = max(self.worst.get(i, -math.inf), told)
            self.own[i].append((params, told))
        elif status == "diverged" and i in self.worst:
            told = self.worst[i]
        if told is not None:
            self.studies[i].on_trial_complete(trial_id, {self.metric: told})
        elif status == "stopped":
            self.studies[i].on_trial_complete(trial_id, None, error=False)  # PRUNED
        else:
            self.studies[i].on_trial_complete(trial_id, None, error=True)  # FAIL
        if told is not None:
            self._record(i, params, told)
        if params in self.anchor_pts[i]:
            k = self.anchor_pts[i].index(params)
            self.anchor_done[i][k] = float(value) if status == "ok" and told is not None else math.nan
            if len(self.anchor_done[i]) == len(self.anchor_pts[i]) and self.offset[i] is None:
                self._transfer(i)

    def _transfer(self, i: int) -> None:
        """Tell arm i's study what arm i−1's study knows, shifted by the offset its anchors measured."""
        narrow = {json.dumps(p, sort_keys=True): v for p, v in self.own[i - 1]}
        pairs = [
            (narrow[json.dumps(p, sort_keys=True)], self.anchor_done[i][k])
            for k, p in enumerate(self.anchor_pts[i])
            if k in self.anchor_done[i]
        ]
        off = level_offset(pairs)
        self.offset[i] = "none" if off is None else off
        if off is not None:
            for params, value in list(self.told[i - 1]):
                if params not in self.anchor_pts[i]:
                    self._add(i, params, value + off)

    def _record(self, i: int, params: dict, value: float) -> None:
        """Arm i's study knows (params, value); pass it on to the wider arm once that one has an offset."""
        self.told[i].append((params, value))
        j = i + 1
        if j < len(self.arms) and isinstance(self.offset[j], float) and params not in self.anchor_pts[j]:
            self._add(j, params, value + self.offset[j])

    def _add(self, i: int, params: dict, value: float) -> None:
        self.studies[i].add_evaluated_point(params, value)
        self._record(i, params, value)

    _STATE = (
        *LadderSearcher._STATE,
        "handed",
        "studies",
        "arm_of_trial",
        "worst",
        "own",
        "told",
        "anchor_pts",
        "anchor_done",
        "offset",
    )
