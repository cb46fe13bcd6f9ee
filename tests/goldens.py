"""Comparing computed results with a golden file: floats within a stated tolerance, everything else exactly.

A golden of floats written on one machine is not bit-for-bit what another computes: BLAS picks its
kernels by CPU (OpenBLAS's Haswell and SkylakeX kernels sum in different orders) and by thread
count, which moves the last few digits of a least-squares fit. `differences` lists every place where
`made` and `golden` differ beyond `rel` (relative to the golden's value), all at once, so a failure
names each field and both values; `floor` gives an absolute tolerance for fields, by name, whose size
is itself rounding noise (a residual of an exact fit), with the reason at the call site.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def differences(made, golden, rel: float, floor: Mapping[str, float] | None = None, path: str = "") -> list[str]:
    floor = floor or {}
    if isinstance(golden, dict) and isinstance(made, dict):
        out = [f"{path}.{k}: missing" for k in golden if k not in made]
        out += [f"{path}.{k}: new {made[k]!r}" for k in made if k not in golden]
        for k in golden:
            if k in made:
                out += differences(made[k], golden[k], rel, floor, f"{path}.{k}")
        return out
    if isinstance(golden, list | tuple) and isinstance(made, list | tuple):
        if len(made) != len(golden):
            return [f"{path}: {len(made)} items, golden {len(golden)}"]
        return [d for i, (m, g) in enumerate(zip(made, golden)) for d in differences(m, g, rel, floor, f"{path}[{i}]")]
    numbers = (int, float)
    if isinstance(golden, float) and isinstance(made, numbers) and not isinstance(made, bool):
        if math.isnan(golden) or math.isinf(golden):
            same = (math.isnan(golden) and math.isnan(made)) or made == golden
        else:
            tol = max(rel * abs(golden), floor.get(path.rsplit(".", 1)[-1], 0.0))
            same = abs(made - golden) <= tol
        return [] if same else [f"{path}: {made!r}, golden {golden!r} (rel {rel:g})"]
    return [] if (type(made) is type(golden) and made == golden) else [f"{path}: {made!r}, golden {golden!r}"]
