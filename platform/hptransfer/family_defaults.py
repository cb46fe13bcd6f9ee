"""Family defaults for the hyperparameters a sweep does not tune (issue 36 item 1): under µP the
package defaults (`Hyperparameters`: output_mult 1, init_std 0.02) are arbitrary, and on our Llama
ladder they left most of the gain on the table (benchmarks/results/joint_regret.json: µP with an LR
grid at the package defaults reached 2.778 at the target, the joint search over lr, output_mult,
init_std and warmup 2.234, 0.54 nats better [0.41, 0.68], 5 seeds).

Each default here is a measured joint optimum, stored with the measurement that produced it:

- `output_mult` = 7 (llama, µP). The joint search's best point on the ladder (widths 32/64, base 32)
  had 7.44; the direct joint search at the target (width 128) 6.75. Why it does not move with the
  base width: the readout (`mup.MuReadout`) is zero-initialised and trained by Adam at the unscaled
  lr, so its logits grow as Δlogit ≈ lr·output_mult·base·|h| per step, while a hidden matrix's
  update at width w is ∝ lr·base/w: their ratio, output_mult·w, is the same at every width for
  every choice of base width. output_mult is the readout's LR relative to the hidden matrices'.
- `init_std` = 0.04 (llama, µP): between the ladder's best point (0.0485) and the direct search's
  (0.0317), their geometric mean rounded. Assumption, stated: held as is when the base width differs
  from the measurement's 32 (hidden matrices then start ×√(base/32) from the measured scale).

Other families (hf configs, mlp) and SP keep the package defaults: nothing was measured for them.
`model.hp_defaults: package` turns these off; a value in `sweep.fixed` or `sweep.grid` always wins.
Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

MEASUREMENT = (
    "benchmarks/results/joint_regret.json (issue 25: Llama depth 2, head 16, seq 64, batch 16, 160 steps, stdlib bytes; "
    "µP ladder 32/64 base 32 → 128; joint TPE over lr, output_mult, init_std, warmup: ladder best output_mult 7.44, "
    "init_std 0.0485; direct search at the target 6.75, 0.0317)"
)


@dataclass(frozen=True)
class FamilyDefaults:
    values: dict[str, float]
    source: str


# (family, parametrization) → defaults. Only what was measured.
FAMILY_DEFAULTS: dict[tuple[str, str], FamilyDefaults] = {
    ("llama", "mup"): FamilyDefaults({"output_mult": 7.0, "init_std": 0.04}, MEASUREMENT),
}


def family_defaults(family: str, parametrization: str) -> FamilyDefaults | None:
    """The measured defaults for a family under a parametrization, or None (package defaults)."""
    return FAMILY_DEFAULTS.get((family, parametrization))


def fill_fixed(fixed: dict[str, float], grid: dict, family: str, parametrization: str) -> dict[str, float]:
    """`fixed` with the family's defaults added for every hyperparameter the sweep neither fixes nor
    searches (a user's value always wins)."""
    d = family_defaults(family, parametrization) if isinstance(family, str) and isinstance(parametrization, str) else None
    if d is None:
        return dict(fixed)
    return {**fixed, **{k: v for k, v in d.values.items() if k not in grid and k not in fixed}}
