"""`private/privacy_ledger.json`: every stage of a fine-tuning study that reads private data, with its
(ε, δ), and their composition: the ε a user may publish for everything the study releases.

Under `dp.tuning: public` (the default, dp/finetune.py) one stage reads the private corpus: the private
large run (DP-SGD, Opacus' accountant). The tuning stages read the public tuning corpus and are
listed under `public_stages`, with their corpus, so a reader sees what was *not* private data.

Composition: basic composition (Dwork & Roth, Theorem 3.16): k mechanisms that are (ε_i, δ_i)-DP
compose to (Σε_i, Σδ_i)-DP, whatever their order or adaptivity. An upper bound; with one entry it is
that entry's (ε, δ) exactly. (A tighter composition of several DP-SGD runs would compose their RDP or
PRV curves; the ledger keeps each entry's accountant for that.)

What the ledger also says: the private large run's reported validation loss is computed on the
private corpus' validation split and is not covered by ε (`unaccounted`), as in every DP training
report that prints a held-out loss; and N (the private sequence count) is treated as public, as
Opacus' sampling rate q = B/N treats it. Pure, and written atomically.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class LedgerEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stage: str
    data: str = Field(description="The private corpus read (dp.data's corpus name).")
    mechanism: str
    epsilon: float = Field(ge=0)
    delta: float = Field(ge=0, le=1)
    accountant: str | None = None
    rdp: list[float] | None = Field(None, description="The entry's RDP curve on the ledger's `orders` (dp.tuning: private).")


class LedgerTotal(BaseModel):
    model_config = ConfigDict(extra="forbid")
    epsilon: float
    delta: float
    accountant: str = Field(description="How the entries were composed.")


class PrivacyLedger(BaseModel):
    model_config = ConfigDict(extra="forbid")
    entries: list[LedgerEntry]
    total: LedgerTotal
    budget_epsilon: float = Field(description="dp.epsilon: the study's whole budget.")
    tuning: str
    public_stages: list[dict[str, str]] = Field(default_factory=list)
    unaccounted: list[str] = Field(default_factory=list)
    orders: list[float] | None = Field(None, description="The Rényi orders of the entries' `rdp` curves.")


BASIC = "basic composition (Dwork & Roth, Thm 3.16): ε and δ add"


def compose(entries: list[LedgerEntry]) -> LedgerTotal:
    """The entries' (ε, δ) under basic composition."""
    eps = math.fsum(e.epsilon for e in entries)
    delta = min(1.0, math.fsum(e.delta for e in entries))
    return LedgerTotal(epsilon=eps, delta=delta, accountant=BASIC)


def compose_rdp(entries: list[LedgerEntry], orders: list[float], delta: float) -> LedgerTotal:
    """The entries' RDP curves added order by order (Mironov 2017, Prop. 1: adaptive composition) and
    converted once to (ε, δ) by Opacus' `get_privacy_spent`: tighter than adding the entries' ε."""
    import numpy as np

    from hptransfer.dp.private_tuning import COMPOSITION, epsilon_of

    curve = np.sum([np.asarray(e.rdp, dtype=float) for e in entries], axis=0)
    return LedgerTotal(epsilon=epsilon_of(curve, delta, np.asarray(orders)), delta=delta, accountant=COMPOSITION)


def private_tuning_ledger(spec: Any, final: dict[str, Any], selection: Any) -> PrivacyLedger:
    """The ledger of a `dp.tuning: private` study: the DP quantile, the tuning (Papernot & Steinke) and
    the private large run, each with its RDP curve, composed by RDP at dp.delta."""
    import numpy as np

    from hptransfer.dp.private_tuning import ORDERS, dp_sgd_rdp, epsilon_of

    dp = spec.dp
    name = corpus_name(dp.data or spec.data)
    mech = selection.doc["mechanism"]
    qd, td = mech["quantile"], mech["trials"]
    run_rdp = dp_sgd_rdp(float(final["sample_rate"]), float(final["noise_multiplier"]), int(final["steps"]))
    entries = [
        LedgerEntry(
            stage="DP quantile for C",
            data=name,
            mechanism=(
                f"noisy binary search for the {qd['quantile']:g}-quantile of {qd['sequences']} private sequences' gradient "
                f"norms: {qd['steps']} counts + N(0, {qd['count_noise_std']:.4g}²), sensitivity 1"
            ),
            epsilon=epsilon_of(selection.quantile_rdp, dp.delta),
            delta=dp.delta,
            accountant="rdp",
            rdp=selection.quantile_rdp.tolist(),
        ),
        LedgerEntry(
            stage="private tuning",
            data=name,
            mechanism=(
                f"best of K ~ {td['law']} DP trials (Papernot & Steinke, Thm 2): each DP-SGD at ε={td['trial_epsilon']:.4g} "
                f"(RDP) and a noisy mean validation loss (clip {td['score']['clip']:.4g}, {td['score']['sequences']} "
                f"sequences, N(0, {td['score']['noise_std']:g}²))"
            ),
            epsilon=epsilon_of(selection.tuning_rdp, dp.delta),
            delta=dp.delta,
            accountant="rdp",
            rdp=selection.tuning_rdp.tolist(),
        ),
        LedgerEntry(
            stage="private large run",
            data=name,
            mechanism=(
                f"DP-SGD (Opacus): Poisson sampling q={final['sample_rate']:.4g}, {final['steps']} steps, per-example "
                f"clipping C={final['clip']:.4g}, Gaussian noise σ={final['noise_multiplier']:.4g}"
            ),
            epsilon=epsilon_of(run_rdp, dp.delta),
            delta=dp.delta,
            accountant="rdp",
            rdp=run_rdp.tolist(),
        ),
    ]
    return PrivacyLedger(
        entries=entries,
        total=compose_rdp(entries, list(ORDERS), dp.delta),
        budget_epsilon=dp.epsilon,
        tuning=dp.tuning,
        public_stages=[{"stage": "pretraining sweep and large run", "data": corpus_name(spec.data)}],
        unaccounted=[
            f"the private large run's validation loss, computed on {name}'s validation split, is reported and not covered by ε",
            f"N = {final['dataset_size']} private sequences is treated as public (Opacus' q = B/N), as is the score's "
            "sequence count",
            "the tuning's running time reveals roughly how many trials ran (Papernot & Steinke's ε covers its output)",
        ],
        orders=[float(x) for x in np.asarray(ORDERS)],
    )


def corpus_name(data: Any) -> str:
    """A corpus' name for the ledger: its `corpus`, with the files' patterns for `files`."""
    return data.corpus if data.corpus != "files" else f"files {list(data.paths)}"


def finetune_ledger(spec: Any, final: dict[str, Any], tuning: Any) -> PrivacyLedger:
    """The ledger of a `dp.tuning: public` fine-tuning study from its private large run's final
    metrics (`epsilon_spent`, `delta`, `accountant`, `dataset_size`, `steps`, `noise_multiplier`)."""
    dp = spec.dp
    private = dp.data or spec.data
    run = LedgerEntry(
        stage="private large run",
        data=corpus_name(private),
        mechanism=(
            f"DP-SGD (Opacus): Poisson sampling q={final['sample_rate']:.4g}, {final['steps']} steps, per-example "
            f"clipping C={final['clip']:.4g}, Gaussian noise σ={final['noise_multiplier']:.4g}"
        ),
        epsilon=float(final["epsilon_spent"]),
        delta=float(final["delta"]),
        accountant=str(final["accountant"]),
    )
    entries = [run]
    return PrivacyLedger(
        entries=entries,
        total=compose(entries),
        budget_epsilon=dp.epsilon,
        tuning=dp.tuning,
        public_stages=[
            {
                "stage": "DP sweep (trials, noise-free arm, per-example gradient norms for C, selection)",
                "data": corpus_name(tuning),
            },
            {"stage": "pretraining sweep and large run", "data": corpus_name(spec.data)},
        ],
        unaccounted=[
            f"the private large run's validation loss, computed on {corpus_name(private)}'s validation split, is reported "
            "and not covered by ε",
            f"N = {final['dataset_size']} private sequences is treated as public (Opacus' q = B/N)",
        ],
    )


def write_ledger(path: Path, ledger: PrivacyLedger) -> Path:
    from hptransfer.io import write_json

    return write_json(path, ledger.model_dump(mode="json"))


__all__ = [
    "BASIC",
    "LedgerEntry",
    "LedgerTotal",
    "PrivacyLedger",
    "compose",
    "compose_rdp",
    "finetune_ledger",
    "private_tuning_ledger",
    "write_ledger",
]
