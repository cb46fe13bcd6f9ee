"""A consumer of an hptransfer hand-off folder, written as someone else's trainer would be: plain
torch and transformers, no hptransfer (checked at the end; it is run as a script in its own
process, `python -I`, by `hpt handoff --register` and tests/test_handoff_conformance.py). For each folder given, it trains
model/ with torch.optim.AdamW built from optimizer.json and transformers' schedule on
conformance/batches.pt, and prints one JSON line: its losses, and the losses of the same loop with
every multiplier forced to 1.

    python consumer.py DIR [DIR ...]
"""

import copy
import json
import math
import re
import sys

import torch
from transformers import AutoModelForCausalLM, get_cosine_with_min_lr_schedule_with_warmup


def optimizer(model, o, use_mults=True):
    groups = [
        {
            "params": [],
            "lr": o["lr"] * (g["lr_mult"] if use_mults else 1),
            "weight_decay": o["weight_decay"] * (g["wd_mult"] if use_mults else 1),
            "eps": o["eps"] * (g["eps_mult"] if use_mults else 1),
        }
        for g in o["param_groups"]
    ]
    for name, p in model.named_parameters():
        first = next(i for i, g in enumerate(o["param_groups"]) if re.fullmatch(g["pattern"], name))
        groups[first]["params"].append(p)
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"])
    s = o["schedule"]
    sched = get_cosine_with_min_lr_schedule_with_warmup(opt, s["warmup_steps"], s["total_steps"], min_lr_rate=s["min_lr_rate"])
    if s.get("sp_warmup"):  # rule sp-warmup: a multiplicative warmup on top, as optimizer.json documents it
        m, tau, base = s["sp_warmup"]["m"], s["sp_warmup"]["timescale"], sched.lr_lambdas[0]
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda t: base(t) * (1 + (m * m - 1) * math.exp(-2 * t / tau)) ** -0.5 if m > 1 else base(t)
        )
    return opt, sched


def train(model, o, batches, use_mults=True):
    opt, sched = optimizer(model, o, use_mults)
    model.train()
    losses = []
    for batch in batches:
        logits = model(batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        if o["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["grad_clip"])
        opt.step()
        sched.step()
    return losses


def main(folders):
    for folder in folders:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(f"{folder}/model", dtype=torch.float32)
        with open(f"{folder}/optimizer.json") as f:
            o = json.load(f)
        batches = torch.load(f"{folder}/conformance/batches.pt")
        ours = train(copy.deepcopy(model), o, batches)
        ones = train(model, o, batches, use_mults=False)
        print(json.dumps({"folder": folder, "losses": ours, "mults_forced_to_1": ones}))
    imported = [m for m in sys.modules if m == "hptransfer" or m.startswith("hptransfer.")]
    assert not imported, f"the consumer imported hptransfer: {imported[:3]}"


if __name__ == "__main__":
    main(sys.argv[1:])
