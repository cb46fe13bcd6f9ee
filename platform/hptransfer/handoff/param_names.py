"""Shared by the per-trainer writers (handoff/to_*.py): optimizer.json's values per HF parameter,
those values on another framework's parameter names, and the comparison the checks make."""

from __future__ import annotations

import contextlib
import math
import re
import sys
from pathlib import Path
from typing import Any

from hptransfer.handoff.groups import OptimizerSpec, assign_groups

Mults = tuple[float, float, float]  # (lr, weight_decay, eps): absolute values for one parameter


def per_param(spec: OptimizerSpec, names: list[str]) -> dict[str, Mults]:
    """Name → (lr, weight_decay, eps) under optimizer.json: first fullmatching group's multipliers."""
    idx = assign_groups(names, spec.param_groups)
    out = {}
    for n in names:
        g = spec.param_groups[idx[n]]
        out[n] = (spec.lr * g.lr_mult, spec.weight_decay * g.wd_mult, spec.eps * g.eps_mult)
    return out


def _abstract(name: str) -> tuple[str, str | None]:
    """`model.layers.3.x` → (`model.layers.{}.x`, "3"); names without a block index → (name, None)."""
    m = re.search(r"\.(\d+)\.", name)
    if m is None:
        return name, None
    return name[: m.start()] + ".{}." + name[m.end() :], m.group(1)


def translate(values: dict[str, Mults], table: dict[str, tuple[str, ...]]) -> tuple[dict[str, Mults], list[str]]:
    """HF-name values onto another framework's names. Several HF tensors may land in one fused
    parameter: their values must agree, else that parameter is reported as a conflict (not merged)."""
    out: dict[str, Mults] = {}
    conflicts: dict[str, set[Mults]] = {}
    for name, v in values.items():
        key, idx = _abstract(name)
        if key not in table:
            raise KeyError(name)
        for target in table[key]:
            t = target.format(idx) if idx is not None else target
            if t in out and out[t] != v:
                conflicts.setdefault(t, {out[t]}).add(v)
            out.setdefault(t, v)
    return out, sorted(conflicts)


def grouped(values: dict[str, Mults], generalise: str) -> list[tuple[list[str], Mults]]:
    """(names, value) groups in first-seen order: names whose block index is replaced by
    `generalise` form one group when every block agrees, else each name stays exact."""
    by_key: dict[str, list[str]] = {}
    for n in values:
        by_key.setdefault(_abstract(n)[0], []).append(n)
    out = []
    for key, names in by_key.items():
        vals = {values[n] for n in names}
        if len(vals) == 1 and "{}" in key:
            out.append(([key.replace("{}", generalise)], vals.pop()))
        else:
            out.extend(([n], values[n]) for n in names)
    return out


def hf_model_names(model_dir: Path) -> tuple[list[str], Any]:
    """Parameter names of the HF model in `model_dir` (built on the meta device: no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [n for n, p in model.named_parameters() if p.requires_grad], config


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0) or a == b


def mismatches(got: dict[str, Mults], want: dict[str, Mults]) -> list[str]:
    bad = [f"{n}: missing from the framework's groups" for n in want if n not in got]
    bad += [f"{n}: not in the hand-off's groups" for n in got if n not in want]
    bad += [
        f"{n}: (lr, wd, eps) {got[n]} != {want[n]}"
        for n in want
        if n in got and not all(_close(a, b) for a, b in zip(got[n], want[n]))
    ]
    return bad


def check_failed(trainer: str, bad: list[str]) -> RuntimeError:
    return RuntimeError(
        f"{trainer} hand-off check: {len(bad)} parameter(s) differ from optimizer.json, e.g. {bad[:3]}; "
        "this is a bug in hptransfer/handoff/trainers.py, not in your plan"
    )


def hf_meta_model(config: Any):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@contextlib.contextmanager
def importable(folder: Path, module: str):
    """`folder` on sys.path and `module` fresh in sys.modules for the duration (a second hand-off
    in this process must not get the first one's cached module)."""
    sys.modules.pop(module, None)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(module, None)


def schedule_note(spec: OptimizerSpec, framework: str) -> list[str]:
    if spec.schedule.sp_warmup is None:
        return []
    return [f"optimizer.json's sp_warmup (a multiplicative warmup) has no {framework} form; not applied"]


def cosine_factor(spec: OptimizerSpec, step: int) -> float:
    """The LR factor without `sp_warmup`: what a framework without a multiplicative warmup can follow."""
    return spec.model_copy(update={"schedule": spec.schedule.model_copy(update={"sp_warmup": None})}).lr_factor(step)
