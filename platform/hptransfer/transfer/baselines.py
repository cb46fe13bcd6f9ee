"""Fitted scaling-law baselines, computed for every plan to compare the transferred LR against.

They are fitted on large standard LLM runs (10^17–10^21 FLOPs), so on small models they are
extrapolations: read them as a sanity check of the order of magnitude, not as a competitor.
Pure functions.
"""

from __future__ import annotations

from typing import Any


def non_embedding_params(family: str, width: int, depth: int, ffn_mult: float = 4.0) -> int:
    """N without embeddings and readout, the N both laws use.
    llama: per block q,k,v,o (4·d², n_kv_heads = n_heads) + gated MLP (3·d·ffn); mlp: depth·d²."""
    if family == "llama":
        return depth * (4 * width * width + 3 * width * int(round(ffn_mult * width)))
    return depth * width * width


def deepseek(n_params: int, tokens: float) -> dict[str, float]:
    """DeepSeek LLM (arXiv 2401.02954, Eq. 1): η_opt = 0.3118·C^−0.125, B_opt = 0.2920·C^0.3271
    tokens, C in FLOPs. Approximation: C ≈ 6·N·D (the paper uses non-embedding FLOPs/token M·D)."""
    c = 6.0 * n_params * tokens
    return {"lr": 0.3118 * c**-0.125, "batch_tokens": 0.2920 * c**0.3271, "compute_flops": c}


def step_law(n_params: int, tokens: float) -> dict[str, float]:
    """Step Law (Li et al., arXiv 2503.04715): η = 1.79·N^−0.713·D^0.307, B = 0.58·D^0.571 tokens,
    N non-embedding parameters, D tokens."""
    return {"lr": 1.79 * n_params**-0.713 * tokens**0.307, "batch_tokens": 0.58 * tokens**0.571}


def baselines_for(
    family: str, width: int, depth: int, ffn_mult: float, steps: int, batch_size: int, seq_len: int, plan_lr: float | None = None
) -> dict[str, Any]:
    n = non_embedding_params(family, width, depth, ffn_mult)
    d = float(steps) * batch_size * seq_len
    out: dict[str, Any] = {
        "non_embedding_params": n,
        "tokens": d,
        "note": "fitted on large SP LLM runs; an order-of-magnitude check here",
    }
    for name, fn in (("deepseek", deepseek), ("step_law", step_law)):
        r = fn(n, d)
        r["batch_sequences"] = r["batch_tokens"] / seq_len
        if plan_lr:
            r["plan_lr_ratio"] = plan_lr / r["lr"]
        out[name] = r
    return out
