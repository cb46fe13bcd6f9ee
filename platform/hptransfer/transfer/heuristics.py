"""Heuristics for changing batch size or steps between the proxy sweep and the target run.

These are not part of any width-transfer theory: they are documented rules of thumb, so every use
is recorded in the plan under `heuristics` with its factor and source, and a user can undo it.
Pure functions.
"""

from __future__ import annotations

import math


def adjust_for_batch_and_steps(
    hps: dict[str, float], batch: int, new_batch: int, steps: int, new_steps: int, hold_lr_wd_product: bool
) -> tuple[dict[str, float], list[dict]]:
    """Returns new hyperparameters and one record per heuristic applied.

    - Batch B → B′, Adam: LR × √(B′/B). The square-root scaling rule for adaptive methods (Malladi,
      Lyu, Panigrahi, Arora, "On the SDEs and Scaling Rules for Adaptive Gradient Algorithms",
      arXiv 2205.10287); paper 1 (arXiv 2510.20616) starts its DP LR search from the same rule.
      Assumption: B′ stays below the critical batch size.
    - When the rule holds η·λ constant (paper 3, arXiv 2510.19093: only η·λ sets the AdamW
      equilibrium ‖ΔW‖/‖W‖ ∝ √(ηλ)), weight decay moves by the inverse factor.
    - Steps T → T′: warmup_steps × T′/T, keeping the warmup *fraction* of the run (the common
      practice in LLM recipes; assumption: the warmup is there for the early-training transient,
      whose length scales with the run)."""
    out, notes = dict(hps), []
    if new_batch != batch:
        k = math.sqrt(new_batch / batch)
        out["lr"] = hps["lr"] * k
        notes.append(
            {
                "name": "adam-sqrt-batch-lr",
                "kind": "heuristic",
                "factor": k,
                "applies_to": "lr",
                "why": f"batch {batch} → {new_batch}: lr × sqrt({new_batch}/{batch})",
                "source": "Malladi et al. 2022, arXiv 2205.10287",
            }
        )
        if hold_lr_wd_product and hps.get("weight_decay", 0.0) > 0:
            out["weight_decay"] = hps["weight_decay"] / k
            notes.append(
                {
                    "name": "hold-lr-wd-product",
                    "kind": "heuristic",
                    "factor": 1 / k,
                    "applies_to": "weight_decay",
                    "why": "lr moved by the batch rule; η·λ held constant",
                    "source": "Kosson et al. 2025, arXiv 2510.19093",
                }
            )
    if new_steps != steps and hps.get("warmup_steps", 0) > 0:
        k = new_steps / steps
        out["warmup_steps"] = float(round(hps["warmup_steps"] * k))
        notes.append(
            {
                "name": "warmup-fraction",
                "kind": "heuristic",
                "factor": k,
                "applies_to": "warmup_steps",
                "why": f"steps {steps} → {new_steps}: warmup keeps its fraction of the run",
                "source": "common LLM practice (assumption)",
            }
        )
    return out, notes
