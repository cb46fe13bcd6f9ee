"""Coordinate check (Tensor Programs V, §"coord check"): train a few Adam steps at several widths
and watch the average activation size |x| of every layer. Under a correct µP it stays flat in
width; under SP it grows (Adam's update of a fan_in-wide dot product adds up ∝ width).

We use `mup.coord_check.get_coord_data` (cuda=False; HF modules that return tuples or caches are
filtered out) and `plot_coord_data`, and turn the curves into a verdict: the slope of
log |x| against log width at the last step, per module; the check fails when any |slope| exceeds
`max_slope` (default 0.25: flat within noise for µP, SP's readout grows with slope ≈ 1).
Activations that *shrink* with width are a µP bug too (e.g. a readout divided by width twice).
The models are built with the sweep's fixed hyperparameters (init_std, output_mult) applied.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from hptransfer import logs, preempt
from hptransfer.hyperparameters import Hyperparameters
from hptransfer.io import save_figure, write_json

if TYPE_CHECKING:
    from hptransfer.context import StudyContext

# Modules whose forward returns a plain tensor (attention/decoder layers return tuples), per family.
from hptransfer.models.families import COORD_CHECK_MODULES as _TRACKED


@dataclass
class CoordCheckResult:
    parametrization: str
    family: str
    widths: list[int]
    steps: int
    max_slope_allowed: float
    slopes: dict[str, float]  # module -> d log|x| / d log width at the last step
    worst_module: str
    worst_slope: float
    passed: bool
    files: dict[str, str] = field(default_factory=dict)


class _LogitsOnly:
    """Wrap a model so forward returns logits (mup's loop expects a tensor)."""

    def __new__(cls, model):
        import torch

        class Wrapped(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.model = m

            def forward(self, x):
                from hptransfer.models import lm_logits

                return lm_logits(self.model, x)

        return Wrapped(model)


def _slope(widths: np.ndarray, values: np.ndarray) -> float:
    ok = values > 0
    if ok.sum() < 2:
        return 0.0
    return float(np.polyfit(np.log(widths[ok]), np.log(values[ok]), 1)[0])


def coord_check(study: StudyContext, widths: list[int] | None = None, batch_size: int = 8, seed: int = 0) -> CoordCheckResult:
    import torch
    from mup.coord_check import get_coord_data, plot_coord_data

    from hptransfer.data import open_corpus
    from hptransfer.models import build_model

    os.environ.setdefault("MPLBACKEND", "Agg")
    spec = study.require_spec()
    cc, m = spec.coord_check, spec.model
    hps = Hyperparameters.of(spec.sweep.fixed)
    widths = widths or cc.widths or list(spec.sweep.widths)
    corpus = open_corpus(spec.data, seq_len=m.seq_len)
    x, y = corpus.batch("train", 0, batch_size, m.seq_len, seed=seed)
    batches = [(x, y.reshape(-1))]  # fix_data: the same batch every step, as in mup's own examples

    t0 = time.time()

    def factory(w):
        def build():
            sigterm.check(f"before width {w}'s model ({widths.index(w)}/{len(widths)} widths done; nothing is kept)")
            # mup builds each width's model just before its steps: one progress line per width
            logs.progress(
                f"coord check {widths.index(w) + 1}/{len(widths)}: width {w}, {cc.steps} Adam steps "
                f"| {time.time() - t0:.0f}s elapsed"
            )
            return _LogitsOnly(build_model(m, w, base_width=spec.base_width, hps=hps, seed=seed))

        return build

    torch.manual_seed(seed)
    with preempt.watch("coordinate check", log=logs.progress) as sigterm:
        df = get_coord_data(
            {w: factory(w) for w in widths},
            batches,
            optimizer="adam",
            lr=cc.lr,
            mup=m.parametrization == "mup",
            flatten_output=True,
            nsteps=cc.steps,
            nseeds=1,
            cuda=False,
            show_progress=False,
            filter_module_by_name=lambda name: bool(_TRACKED.search(name)),
        )
        sigterm.check("after its last width (nothing is kept)")
    df["module"] = df["module"].str.removeprefix("model.")
    last = df[df.t == cc.steps]
    slopes = {}
    for module, g in last.groupby("module"):
        g = g.groupby("width")["l1"].mean()
        slopes[module] = _slope(g.index.to_numpy(dtype=float), g.to_numpy(dtype=float))
    worst = max(slopes, key=lambda k: abs(slopes[k]))
    result = CoordCheckResult(
        parametrization=m.parametrization,
        family=m.family,
        widths=widths,
        steps=cc.steps,
        max_slope_allowed=cc.max_slope,
        slopes=slopes,
        worst_module=worst,
        worst_slope=slopes[worst],
        passed=abs(slopes[worst]) <= cc.max_slope,
    )
    paths = study.paths
    paths.root.mkdir(parents=True, exist_ok=True)
    fig = plot_coord_data(
        df,
        legend=False,
        suptitle=f"coord check: {m.family}/{m.parametrization}, Adam lr={cc.lr} "
        f"({'PASS' if result.passed else 'FAIL'}: worst slope {result.worst_slope:.2f} in {worst})",
    )
    result.files = {"plot": str(save_figure(fig, paths.coord_check_png)), "data": str(paths.coord_check_json)}
    write_json(paths.coord_check_json, {**asdict(result), "records": df.to_dict(orient="records")})
    return result


def describe(result: CoordCheckResult) -> str:
    verdict = "PASS (activations flat in width)" if result.passed else "FAIL (activations change with width)"
    return (
        f"coord check {result.family}/{result.parametrization} over widths {result.widths}: {verdict}; "
        f"worst slope {result.worst_slope:.2f} ({result.worst_module}) vs allowed {result.max_slope_allowed}"
        + (
            ""
            if result.passed or math.isnan(result.worst_slope)
            else "; under SP this is expected — use parametrization: mup or a transfer rule for SP"
        )
    )
