"""σ√T tables (paper 1, arXiv 2510.20616; docs/RESEARCH.md) for N=50,000, E=8, δ=1e-5, ε ∈ {0.5, 1, 2, 8}, both Opacus
accountants, compared with the reference table in docs/RESEARCH.md, plus the wall time of `dp_plan_for`
(what `hpt dp-plan` computes) with the default batch grid.

Run: .venv/bin/python benchmarks/dp_noise_table.py   → benchmarks/results/dp_noise_table.json
"""

from __future__ import annotations

import argparse
import math
import platform
import time

from hptransfer.dp.accounting import noise_multiplier, noise_table, steps_for
from hptransfer.dp.plan import dp_plan_for
from hptransfer.io import write_json
from hptransfer.privacy import DPConfig

from common import RESULTS

N, E, DELTA = 50_000, 8, 1e-5
EPSILONS = [0.5, 1.0, 2.0, 8.0]
TABLE_B = [256, 1024, 4096, 16384, 50_000]
# docs/RESEARCH.md, paper 1 (RDP, epsilon_tolerance=0.001).
REFERENCE = {
    0.5: {256: 69.2, 1024: 64.9, 4096: 63.8, 16384: 64.3, 50000: 61.4},
    8.0: {256: 21.8, 1024: 13.3, 4096: 8.9, 16384: 6.8, 50000: 5.1},
}


def main(argv: list[str] | None = None) -> dict:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)  # no options: --help only
    out: dict = {
        "setting": {"N": N, "epochs": E, "delta": DELTA, "batch_sizes": TABLE_B},
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "tables": {},
        "reference_comparison": [],
        "plan_timing": [],
        "chosen": {},
    }
    for acc in ("rdp", "prv"):
        for eps in EPSILONS:
            t0 = time.perf_counter()
            rows = noise_table(eps, DELTA, N, E, TABLE_B, min_steps=1, accountant=acc, epsilon_tolerance=0.001)
            out["tables"][f"{acc}/eps={eps:g}"] = {
                "seconds": round(time.perf_counter() - t0, 2),
                "rows": [
                    {
                        "B": r.batch_size,
                        "T": r.steps,
                        "sigma": round(r.sigma, 4),
                        "sigma_sqrt_T": round(r.sigma_sqrt_t, 2),
                        "sigma_over_B": r.sigma_over_b,
                    }
                    for r in rows
                ],
            }
            print(f"{acc} ε={eps:<4g}", " ".join(f"B={r.batch_size}:{r.sigma_sqrt_t:.1f}" for r in rows), flush=True)
    for eps, ref in REFERENCE.items():
        for b, want in ref.items():
            t = steps_for(N, E, b)
            got = noise_multiplier(eps, DELTA, b / N, t, "rdp", 0.001) * math.sqrt(t)
            prv = noise_multiplier(eps, DELTA, b / N, t, "prv", 0.001) * math.sqrt(t)
            out["reference_comparison"].append(
                {
                    "eps": eps,
                    "B": b,
                    "reference": want,
                    "rdp": round(got, 2),
                    "rel_err": round(got / want - 1, 4),
                    "prv": round(prv, 2),
                    "prv_vs_rdp": round(prv / got - 1, 4),
                }
            )
    noise_multiplier.cache_clear()  # time the plan from cold, as `hpt dp-plan` runs it
    for acc in ("rdp", "prv"):
        for eps in EPSILONS:
            t0 = time.perf_counter()
            plan = dp_plan_for(DPConfig(epsilon=eps, delta=DELTA, dataset_size=N, epochs=E, accountant=acc))
            dt = time.perf_counter() - t0
            out["plan_timing"].append({"accountant": acc, "eps": eps, "batch_sizes": len(plan.table), "seconds": round(dt, 2)})
            out["chosen"][f"{acc}/eps={eps:g}"] = {
                "B": plan.batch_size,
                "T": plan.steps,
                "sigma": round(plan.noise_multiplier, 4),
                "epsilon_check": round(plan.epsilon_check, 4),
                "clip_shift": round(plan.clip_shift, 3),
            }
            print(f"plan {acc} ε={eps:g}: B={plan.batch_size} T={plan.steps} in {dt:.1f}s", flush=True)
    write_json(RESULTS / "dp_noise_table.json", out)
    return out


if __name__ == "__main__":
    main()
