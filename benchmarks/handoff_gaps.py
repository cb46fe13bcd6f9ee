"""What a trainer loses when it cannot follow the hand-off exactly (issue 22): per-group Adam ε
dropped (eps_mult forced to 1), torchtitan's warmup ((t+1)/w instead of transformers' t/w), and,
for scale, every multiplier dropped (µP's LR / weight decay / ε groups all 1: SP at the µP LR), and
as the floor, the exact run with the input embedding nudged by one float32 ulp (this small-batch regime
amplifies any rounding difference: a gap is only an effect where it stands above that floor).

Each case trains the hand-off's own model on its own conformance batches with plain torch AdamW
(the loop any consumer writes from optimizer.json) and compares the mean train loss of the last 20
steps with the exact hand-off's, paired over plan seeds (a different init and data stream each).
Plans: µP Llama width 64 over base 16 (readout α = 1/2: lm_head ε ×2) and the same with attention
scale 1/d and 2 heads (head_dim 8 → 32, so the fold gives q_proj lr ×1/2, wd ×2, ε ×2 too).

    .venv/bin/python benchmarks/handoff_gaps.py [--seeds 5] [--steps 100]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, machine_info, t_interval, verdict

NEGLIGIBLE = 0.005  # nats: a gap inside ±this is "negligible" (the regret goal of transfer_regret.py)
LAST = 20


def make_plan(seed: int, steps: int, attn_1_over_d: bool):
    import yaml

    from hptransfer.plan import TransferPlan

    root = Path(__file__).resolve().parents[1]
    base = yaml.safe_load((root / "tests/data/old_plans/hpt_run_console.yaml").read_text())
    d = {k: v for k, v in base.items() if k not in ("diagnostics", "param_group_multipliers", "heuristics", "baselines")}
    model = {"family": "llama", "depth": 2, "head_dim": 8, "seq_len": 16, "parametrization": "mup"}
    if attn_1_over_d:  # a family-hf option; 2 heads, so head_dim grows with width and 1/d differs from 1/√d
        model = {
            "family": "hf",
            "config": {"model_type": "llama", "num_attention_heads": 2, "num_key_value_heads": 2},
            "depth": 2,
            "n_heads": 2,
            "attn_scale": "1/d",
            "seq_len": 16,
            "parametrization": "mup",
        }
    d.update(rule="mup", model=model, base_width=16, schedule={"kind": "none"}, seed=seed)
    d["target"] = {"width": 64, "steps": steps, "batch_size": 8, "seq_len": 16}
    d["hyperparameters"] = {"lr": 0.02, "warmup_steps": 20.0, "output_mult": 2.0, "weight_decay": 0.1}
    return TransferPlan.model_validate(d)


def train(folder: Path, case: str) -> list[float]:
    """optimizer.json applied by hand (first fullmatch wins), transformers' schedule, the batches."""
    import torch
    from transformers import AutoModelForCausalLM, get_cosine_with_min_lr_schedule_with_warmup

    spec = json.loads((folder / "optimizer.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(folder / "model", dtype=torch.float32)
    if case == "rounding_floor":  # the input embedding nudged by one float32 ulp: how far rounding alone drifts
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(1 + 2**-23)
    groups = []
    for name, p in model.named_parameters():
        g = next(g for g in spec["param_groups"] if re.fullmatch(g["pattern"], name))
        lr_m, wd_m, eps_m = (1.0, 1.0, 1.0) if case == "no_multipliers" else (g["lr_mult"], g["wd_mult"], g["eps_mult"])
        if case == "no_eps_mult":
            eps_m = 1.0
        groups.append(
            {"params": [p], "lr": spec["lr"] * lr_m, "weight_decay": spec["weight_decay"] * wd_m, "eps": spec["eps"] * eps_m}
        )
    opt = torch.optim.AdamW(groups, betas=tuple(spec["betas"]))
    s = spec["schedule"]
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, s["warmup_steps"], s["total_steps"], min_lr_rate=s["min_lr_rate"])
    if case == "torchtitan_warmup":  # torchtitan 0.3's LRSchedulersContainer: (t+1)/w during warmup, the same cosine after
        cos, w = sched.lr_lambdas[0], s["warmup_steps"]
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: (t + 1) / w if t < w else cos(t))
    batches = torch.load(folder / "conformance" / "batches.pt")
    losses = []
    for b in batches:
        loss = torch.nn.functional.cross_entropy(model(input_ids=b[:, :-1]).logits.flatten(0, 1), b[:, 1:].flatten())
        loss.backward()
        if spec["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["grad_clip"])
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


CASES = ["exact", "rounding_floor", "no_eps_mult", "torchtitan_warmup", "no_multipliers"]


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--out", type=Path, default=RESULTS / "handoff_gaps.json")
    args = ap.parse_args(argv)

    from hptransfer.env import configure
    from hptransfer.handoff.write import write_handoff
    from hptransfer.io import write_json

    configure()
    import torch

    torch.set_num_threads(1)  # tiny matrices on a shared box: threads only contend
    result = {"machine": machine_info(sys.argv), "steps": args.steps, "last": LAST, "negligible_nats": NEGLIGIBLE, "plans": {}}
    for plan_name, attn in (("mup-llama", False), ("mup-llama-attn-1/d", True)):
        final = {c: [] for c in CASES}
        max_rel = {c: [] for c in CASES}
        eps_mults = None
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                res = write_handoff(make_plan(seed, args.steps, attn), Path(tmp) / "h", steps=args.steps, trainers=False)
                eps_mults = sorted({g.eps_mult for g in res.optimizer.param_groups})
                runs = {c: train(res.out, c) for c in CASES}
            for c in CASES:
                final[c].append(sum(runs[c][-LAST:]) / LAST)
                max_rel[c].append(max(abs(a - b) / b for a, b in zip(runs[c], runs["exact"])))
        plan = {"eps_mults": eps_mults, "exact_final_loss": t_interval(final["exact"]).as_dict(), "cases": {}}
        for c in CASES[1:]:
            gap = t_interval(a - b for a, b in zip(final[c], final["exact"])).as_dict()
            plan["cases"][c] = {
                "final_loss_gap": gap,
                "max_per_step_relative_gap": max(max_rel[c]),
                "verdict_negligible": verdict(gap["lo"], gap["hi"], inside=(-NEGLIGIBLE, NEGLIGIBLE)),
            }
        result["plans"][plan_name] = plan
        print(plan_name, json.dumps(plan["cases"], indent=1))
    result["table"] = table(result["plans"])
    return write_json(args.out, result)


def table(plans: dict) -> list[dict]:
    """One flat row per plan and case (BENCHMARKS.md renders a list of flat rows as a table)."""
    return [
        {
            "plan": name,
            "case": case,
            "gap_nats": r["final_loss_gap"]["mean"],
            "lo": r["final_loss_gap"]["lo"],
            "hi": r["final_loss_gap"]["hi"],
            "max_step_rel_gap": r["max_per_step_relative_gap"],
            "negligible": r["verdict_negligible"],
        }
        for name, p in plans.items()
        for case, r in p["cases"].items()
    ]


if __name__ == "__main__":
    main()
