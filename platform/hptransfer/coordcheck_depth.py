"""Coordinate check over depth: the depth analogue of coordcheck.py.

At a fixed width (the base width) and the sweep's fixed hyperparameters, build the model at each
depth of `coord_check.depths` (the depth rule of `model.depth_parametrization` applied relative to
`model.base_depth`), take `coord_check.steps` Adam steps on one fixed batch and record the residual
stream (the input of the final norm): its size |h| and its change |h_t − h_0| after each step. Under
standard residuals (`none`) each of the L branches adds an O(η) update, so the change grows ∝ L
(slope ≈ 1 in log-log); under `depth-mup` and `completep` it stays O(1) (slope ≈ 0). Verdict: the
slope of log |h_T − h_0| against log depth at the last step; the check fails when |slope| >
`coord_check.max_depth_slope` (default 0.5). Measured here (llama, width 32, depths 2–16, lr 1e-2,
4 steps): none 0.98, depth-mup −0.21, completep −0.18.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from hptransfer import logs
from hptransfer.hyperparameters import Hyperparameters
from hptransfer.io import save_figure, write_json

if TYPE_CHECKING:
    from hptransfer.context import StudyContext

JSON_FILE, PNG_FILE = "coord_check_depth.json", "coord_check_depth.png"


@dataclass
class DepthCheckResult:
    depth_parametrization: str
    family: str
    width: int
    depths: list[int]
    steps: int
    max_slope_allowed: float
    slope: float  # d log|h_T − h_0| / d log depth at the last step
    size_slope: float  # d log|h_T| / d log depth, for reference
    passed: bool
    records: list[dict] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)


def _final_norm(model):
    """The norm that reads the residual stream after the last block (Llama's model.norm, GPT-2's ln_f, ...)."""
    from hptransfer.models.depth import BLOCK

    norms = [m for n, m in model.named_modules() if "norm" in type(m).__name__.lower() and not BLOCK.search(n + ".")]
    if not norms:
        raise NotImplementedError(f"{type(model).__name__} has no final norm to read the residual stream from")
    return norms[-1]


def _slope(depths: list[int], values: list[float]) -> float:
    v = np.asarray(values, dtype=float)
    ok = v > 0
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(np.asarray(depths, dtype=float)[ok]), np.log(v[ok]), 1)[0])


def residual_changes(
    model_spec, width: int, depths: list[int], hps: Hyperparameters, batch, steps: int, lr: float, seed: int = 0
):
    """Per depth: |h_t| and |h_t − h_0| of the residual stream after each of `steps` Adam steps (t = 0..steps)."""
    from hptransfer.models import build_model, build_optimizer, lm_logits
    from hptransfer.models.build import lm_loss
    from hptransfer.models.depth import depth_scaling

    x, y = batch
    records = []
    for depth in depths:
        spec = model_spec.model_copy(update={"depth": depth, "base_depth": model_spec.base_depth or model_spec.depth})
        model = build_model(spec, width, base_width=width, hps=hps, seed=seed)
        opt = build_optimizer(model, spec.parametrization, hps.model_copy(update={"lr": lr}), "independent", depth_scaling(spec))
        seen = {}
        _final_norm(model).register_forward_pre_hook(lambda _m, inp, seen=seen: seen.__setitem__("h", inp[0].detach().float()))
        h0 = None
        for t in range(steps + 1):
            loss = lm_loss(lm_logits(model, x), y)
            h = seen["h"]
            h0 = h if h0 is None else h0
            records.append({"depth": depth, "t": t, "size": h.abs().mean().item(), "change": (h - h0).abs().mean().item()})
            if t < steps:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        del model, opt
    return records


def coord_check_depth(
    study: StudyContext, depths: list[int] | None = None, batch_size: int = 8, seed: int = 0
) -> DepthCheckResult:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hptransfer.data import open_corpus

    spec = study.require_spec()
    cc, m = spec.coord_check, spec.model
    depths = sorted(depths or cc.depths or [])
    if len(depths) < 2:
        raise ValueError("the depth check needs at least two depths: set coord_check.depths or pass --depths")
    width = spec.base_width
    hps = Hyperparameters.of(spec.sweep.fixed)
    corpus = open_corpus(spec.data, seq_len=m.seq_len)
    x, y = corpus.batch("train", 0, batch_size, m.seq_len, seed=seed)
    t0 = time.time()
    logs.progress(f"coord check over depth: width {width}, depths {depths}, {cc.steps} Adam steps each")
    records = residual_changes(m, width, depths, hps, (x, y), cc.steps, cc.lr, seed)
    last = {r["depth"]: r for r in records if r["t"] == cc.steps}
    slope = _slope(depths, [last[d]["change"] for d in depths])
    result = DepthCheckResult(
        depth_parametrization=m.depth_parametrization,
        family=m.family,
        width=width,
        depths=depths,
        steps=cc.steps,
        max_slope_allowed=cc.max_depth_slope,
        slope=slope,
        size_slope=_slope(depths, [last[d]["size"] for d in depths]),
        passed=bool(np.isfinite(slope) and abs(slope) <= cc.max_depth_slope),
        records=records,
    )
    root = study.paths.root
    root.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for t in range(1, cc.steps + 1):
        rows = [r for r in records if r["t"] == t]
        axes[0].plot([r["depth"] for r in rows], [r["change"] for r in rows], marker="o", label=f"step {t}")
    rows0 = [r for r in records if r["t"] == cc.steps]
    axes[1].plot([r["depth"] for r in rows0], [r["size"] for r in rows0], marker="o")
    for ax, what in zip(axes, ("|h_t − h_0| (residual stream change)", f"|h| after {cc.steps} steps")):
        ax.set(xscale="log", yscale="log", xlabel="depth (blocks)", title=what)
    axes[0].legend()
    fig.suptitle(
        f"coord check over depth: {m.family}, depth_parametrization {m.depth_parametrization}, width {width} "
        f"({'PASS' if result.passed else 'FAIL'}: slope {slope:.2f}, allowed ±{cc.max_depth_slope}; {time.time() - t0:.0f}s)"
    )
    result.files = {"plot": str(save_figure(fig, root / PNG_FILE)), "data": str(root / JSON_FILE)}
    write_json(root / JSON_FILE, asdict(result))
    return result


def describe(result: DepthCheckResult) -> str:
    verdict = "PASS (residual stream change flat in depth)" if result.passed else "FAIL (residual stream change grows with depth)"
    hint = ""
    if not result.passed and result.depth_parametrization == "none":
        hint = "; expected with standard residuals: set model.depth_parametrization: completep to transfer across depth"
    return (
        f"coord check over depth {result.family}/{result.depth_parametrization} at width {result.width}, depths "
        f"{result.depths}: {verdict}; slope {result.slope:.2f} vs allowed {result.max_slope_allowed}{hint}"
    )
