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


BASIC = "basic composition (Dwork & Roth, Thm 3.16): ε and δ add"


def compose(entries: list[LedgerEntry]) -> LedgerTotal:
    """The entries' (ε, δ) under basic composition."""
    eps = math.fsum(e.epsilon for e in entries)
    delta = min(1.0, math.fsum(e.delta for e in entries))
    return LedgerTotal(epsilon=eps, delta=delta, accountant=BASIC)


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


__all__ = ["BASIC", "LedgerEntry", "LedgerTotal", "PrivacyLedger", "compose", "finetune_ledger", "write_ledger"]
