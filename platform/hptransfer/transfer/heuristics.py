"""Heuristics for changing batch size or steps between the proxy sweep and the target run.

These are not part of any width-transfer theory: they are documented rules of thumb, so every use
is recorded in the plan under `heuristics` with its factor and source, and a user can undo it.
Pure functions.
"""

from __future__ import annotations

from hptransfer.transfer.priors import PRIORS

BATCH_HEURISTIC = "adam-batch-lr"  # the batch prior applied by a rule (the axes layer keeps it as the record)


def adjust_for_batch_and_steps(
    hps: dict[str, float], batch: int, new_batch: int, steps: int, new_steps: int, hold_lr_wd_product: bool
) -> tuple[dict[str, float], list[dict]]:
    """Returns new hyperparameters and one record per heuristic applied.

    - Batch B → B′ at the run's own steps, Adam: LR × (B′/B)^0.375 (transfer/priors.py): the
      square-root rule (Malladi, Lyu, Panigrahi, Arora, "On the SDEs and Scaling Rules for Adaptive
      Gradient Algorithms", arXiv 2205.10287) holds at a fixed number of samples; at fixed steps
      the B′/B more tokens add the horizon prior's −0.125. Paper 1 (arXiv 2510.20616) starts its DP
      LR search from the √B rule. Assumption: B′ stays below the critical batch size.
    - When the rule holds η·λ constant (paper 3, arXiv 2510.19093: only η·λ sets the AdamW
      equilibrium ‖ΔW‖/‖W‖ ∝ √(ηλ)), weight decay moves by the inverse factor.
    - Steps T → T′: warmup_steps × T′/T, keeping the warmup *fraction* of the run (the common
      practice in LLM recipes; assumption: the warmup is there for the early-training transient,
      whose length scales with the run)."""
    out, notes = dict(hps), []
    if new_batch != batch:
        b = PRIORS["batch_size"].exponent
        k = (new_batch / batch) ** b
        out["lr"] = hps["lr"] * k
        notes.append(
            {
                "name": BATCH_HEURISTIC,
                "kind": "heuristic",
                "factor": k,
                "applies_to": "lr",
                "why": f"batch {batch} → {new_batch} at fixed steps: lr × ({new_batch}/{batch})^{b:g}",
                "source": PRIORS["batch_size"].source,
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
