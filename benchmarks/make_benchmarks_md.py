"""Generate BENCHMARKS.md from benchmarks/results/*.json: for every result, the command that
reproduces it, the machine it ran on, the date, its figure and its numbers. Nothing is typed by
hand: rerun a benchmark, then this script.

`transfer_regret` and `paper_claims` get their own tables; any other result is rendered
generically (scalars, and lists of records as tables), so a new benchmark shows up without edits.

Run: .venv/bin/python benchmarks/make_benchmarks_md.py   → BENCHMARKS.md
     (`--check`: exit 1 if BENCHMARKS.md is not what the JSONs give, writing nothing)
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import json
import math
import re
import subprocess
import sys
from pathlib import Path

from common import RESULTS, ROOT, t_interval, verdict


def g(x, fmt: str = ".4g") -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e9):
        return str(int(x))  # batch sizes, step counts: never 1.638e+04
    if isinstance(x, float):
        return format(x, fmt) if math.isfinite(x) else "—"
    return str(x).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(g(c) if not isinstance(c, str) else c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def script_doc(stem: str) -> tuple[str, str | None]:
    """(first docstring line, the `Run:` command) of benchmarks/<stem>.py, if it exists."""
    path = ROOT / "benchmarks" / f"{stem}.py"
    if not path.is_file():
        return stem, None
    text = path.read_text()
    m = re.search(r'^"""(.*?)"""', text, re.S)
    doc = m.group(1) if m else ""
    run = re.search(r"^Run:\s*(.+?)(\s+→.*)?$", doc, re.M)
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return first, run.group(1).strip() if run else f".venv/bin/python benchmarks/{stem}.py"


def result_date(d: dict, path: Path) -> str:
    """When a result was measured, as it records it (`date`, else `machine.date_utc`). A result that
    records none gets its commit time, so a fresh clone renders the same page; the file's time only
    for a result not committed as it is (a checkout resets file times)."""
    m = d.get("machine")
    recorded = d.get("date") or (m.get("date_utc") if isinstance(m, dict) else None)
    if recorded:
        return recorded
    git = ["git", "-C", str(ROOT)]
    try:
        modified = subprocess.run([*git, "status", "--porcelain", "--", str(path)], capture_output=True, text=True, check=True)
        committed = subprocess.run(
            [*git, "log", "-1", "--format=%cI", "--", str(path)], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):  # no git, or not a repository
        modified = committed = None
    if modified is not None and not modified.stdout.strip() and committed.stdout.strip():
        return f"{committed.stdout.strip()} (committed)"
    return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).isoformat(timespec="seconds") + " (file time)"


def header(stem: str, d: dict, path: Path) -> str:
    title, run = script_doc(stem)
    m = d.get("machine")
    if run is None:
        # A what-if's result (sweep_overhead_resident_ray.json) comes from its script's flag: the
        # script's title, and the command the result recorded (else the script's own).
        parents = [p.stem for p in (ROOT / "benchmarks").glob("*.py") if stem.startswith(p.stem + "_")]
        if parents:
            title, run = script_doc(max(parents, key=len))
        if isinstance(m, dict) and isinstance(m.get("command"), str) and m["command"].startswith("python "):
            run = ".venv/bin/" + m["command"]
    date = result_date(d, path)
    machine = ", ".join(f"{k}={v}" for k, v in m.items()) if isinstance(m, dict) else (m or "not recorded")
    fig = d.get("figure") or (f"benchmarks/results/{stem}.png" if (RESULTS / f"{stem}.png").is_file() else None)
    lines = [
        f"## {stem}",
        "",
        title,
        "",
        f"- command: `{d.get('command') or run}`",
        f"- machine: {machine}",
        f"- date: {date}",
        f"- data: [`benchmarks/results/{path.name}`](benchmarks/results/{path.name})",
    ]
    for k in ("wall_s", "seconds"):
        if isinstance(d.get(k), (int, float)):
            lines.append(f"- wall time: {d[k]:.0f} s")
    if isinstance(d.get("total_train_wall_s"), (int, float)):
        lines.append(
            f"- training: {d['total_train_wall_s']:.0f} s summed over all runs (cached runs are reused; this invocation "
            f"trained {d.get('runs_trained_this_invocation', '?')} and took {d.get('process_wall_s', float('nan')):.0f} s)"
        )
    out = "\n".join(lines) + "\n"
    if fig:
        out += f"\n![{stem}]({fig})\n"
    return out


# --- verdicts, derived here from intervals (never typed by hand) --------------------------------


def slope_interval(optima: dict) -> tuple[float, float, float] | None:
    """Slope of log lr* against log width with its 95% interval (t, n−2 dof), recomputed from the
    per-width optima in the JSON; optima on the grid edge are bounds, not points, and are left out."""
    from scipy.stats import t as student

    from hptransfer.transfer.fitting import fit_log_linear

    pts = sorted((int(w), o["fitted_lr"]) for w, o in optima.items() if not o.get("on_edge"))
    if len(pts) < 3:
        return None
    f = fit_log_linear([w for w, _ in pts], [math.log(v) for _, v in pts])
    q = student.ppf(0.975, len(pts) - 2)
    return f.b, f.b - q * f.b_se, f.b + q * f.b_se


def _slope_text(name: str, si) -> str:
    return f"{name} slope " + ("— (fewer than 3 interior optima)" if si is None else f"{si[0]:+.2f} [{si[1]:+.2f}, {si[2]:+.2f}]")


def _pct(x) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{100 * x:+.2f}%"


def _ci_pct(ci) -> str:
    return "—" if not ci else f"[{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]"


def _short(warnings: list[str], n: int = 2, width: int = 150) -> str:
    """The first warnings, each cut to `width` characters (the JSON keeps them whole)."""
    if not warnings:
        return "—"
    cut = [w if len(w) <= width else w[: width - 1] + "…" for w in warnings[:n]]
    return "; ".join(cut) + (f" (+{len(warnings) - n} more in the JSON)" if len(warnings) > n else "")


def regret_verdict(r: dict, goal: float = 0.005, ceiling: float = 0.01, compute: float = 0.05) -> str:
    """µP's goal (issue 12): regret ≤ 0.5% with the interval's upper end ≤ 1% at ≤ 5% of the direct
    sweep's compute — met / missed / inconclusive (the interval straddles the 1% ceiling)."""
    if not r.get("regret_ci"):
        return "inconclusive (no interval)"
    lo, hi = r["regret_ci"]
    if r["compute_fraction"] > compute:
        return f"missed (compute {100 * r['compute_fraction']:.1f}% > {100 * compute:g}%)"
    if r["relative_regret"] <= goal and hi <= ceiling:
        return "met"
    if lo > goal:
        return "missed"
    return "inconclusive"


def calibration_verdict(r: dict) -> tuple[str, str]:
    """Predicted penalty against measured absolute regret: (ratio text, verdict). A measured regret
    whose interval contains 0 cannot anchor a ratio: the prediction is then only checked for being
    within the measured interval."""
    p, ci, m = r.get("predicted_penalty"), r.get("absolute_regret_ci"), r.get("absolute_regret")
    if p is None or not ci:
        return "—", "inconclusive (no prediction or no interval)"
    if ci[0] <= 0 <= ci[1]:
        return "—", (
            "consistent (measured regret within noise; prediction inside its interval)"
            if p <= ci[1]
            else "over-predicts (measured regret within noise)"
        )
    ratio = p / m
    if 0.5 <= ratio <= 2:
        return f"{ratio:.2f}", "within 2×"
    return f"{ratio:.2f}", ("over-predicts" if ratio > 2 else "under-predicts") + " by more than 2×"


def regret_section(d: dict) -> str:
    s = d["setting"]
    if "seeds" not in s:
        raise KeyError("setting.seeds")
    rows = [
        [
            r["name"],
            r["variant"],
            g(r["transferred_lr"]),
            " ".join(g(x) for x in r["target_losses"]),
            g(r["best_direct_lr"]),
            g(r["best_direct_loss"]),
            _pct(r["relative_regret"]),
            _ci_pct(r["regret_ci"]),
            f"{100 * r['compute_fraction']:.1f}%",
            regret_verdict(r) if r["parametrization"] == "mup" else "n/a",
            _short(r["warnings"]),
        ]
        for r in d["rules"]
    ]
    t = md_table(
        [
            "rule",
            "direct sweep",
            "transferred lr",
            "target loss per seed",
            "best direct lr",
            "best direct loss (seed mean)",
            "relative regret",
            "95% interval",
            "ladder compute vs direct",
            "µP goal",
            "diagnostics' warnings",
        ],
        rows,
    )
    cal = []
    for r in d["rules"]:
        ratio, v = calibration_verdict(r)
        pi = r.get("predicted_penalty_interval")
        pw = r.get("predicted_penalty_weights")
        cal.append(
            [
                r["name"],
                f"{pw['no_drift']:.2f}" if pw else "—",
                g(r.get("predicted_penalty")),
                f"[{g(pi[0])}, {g(pi[1])}]" if pi else "—",
                g(r.get("absolute_regret")),
                f"[{g(r['absolute_regret_ci'][0])}, {g(r['absolute_regret_ci'][1])}]" if r.get("absolute_regret_ci") else "—",
                ratio,
                v,
            ]
        )
    ct = md_table(
        [
            "rule",
            "no-drift weight",
            "predicted penalty",
            "predicted interval",
            "measured regret (loss)",
            "measured 95% interval",
            "ratio",
            "verdict",
        ],
        cal,
    )
    sm = d.get("sp_copied_minus_mup")
    if sm:
        lo, hi = sm["ci"]
        v = "reproduced" if lo > 0 else ("not reproduced" if hi < 0 else "inconclusive")
        spv = f"SP copied minus µP, relative regret (paired by seed): {_pct(sm['mean'])} {_ci_pct(sm['ci'])} → SP copied significantly worse than µP: **{v}**."
    else:
        spv = "SP copied vs µP: not measured."
    noise = "; ".join(
        f"{v}: seed SD {g(dd['target_noise']['seed_sd'], '.3g')} = {100 * dd['target_noise']['relative']:.3f}% of the loss"
        for v, dd in d["direct"].items()
    )
    curves = []
    for v, dd in d["direct"].items():
        curves.append(
            f"- {v} direct sweep at width {s['target']} (seed mean [95% CI]): "
            + ", ".join(
                f"{c['lr']:g}→{g(c['mean'])}"
                + (f" [{g(c['ci'][0])}, {g(c['ci'][1])}]" if math.isfinite(c["mean"]) else " (diverged)")
                for c in dd["curve"]
            )
            + f" (ladder {dd['ladder_wall_s']:.0f} s vs direct {dd['direct_wall_s']:.0f} s of training wall time)"
        )
    mup = [r for r in d["rules"] if r["parametrization"] == "mup"]
    return (
        f"\nModel family `{s['family']}` depth {s['depth']}; ladder {s['ladder']} → target {s['target']} ({s['width_ratio']:.0f}× the widest), "
        f"{s['steps']} steps × batch {s['batch']} × seq {s['seq_len']} ({s['tokens_per_step']} tokens/step), evaluation on {s['eval_tokens']:,} fixed "
        f"held-out tokens, AdamW λ={s['weight_decay']}; ladder: seed {s['seed']} on the grid + {s['ladder_noise_seeds']} replicate seeds at each "
        f"width's best point; direct sweep and transferred runs: seeds {s['seeds']}. LR grids (factor 2): "
        + ", ".join(f"{k} {v[0]:g}…{v[-1]:g}" for k, v in s["grids"].items())
        + f".\n\nNoise at the target (is the regime able to resolve 0.5%?): {noise}.\n\n"
        + t
        + "\n\n"
        + "µP goal (regret ≤ 0.5%, interval's upper end ≤ 1%, ladder ≤ 5% of the direct sweep's compute): "
        + "; ".join(f"{r['name']}: **{regret_verdict(r)}**" for r in mup)
        + ".\n\n"
        + spv
        + "\n\n### Predicted penalty against measured regret (calibration)\n\n"
        + "The penalty is κ·E[(x_rule − x*)²] with x* = log lr* at the target estimated from the ladder; when the drift test "
        + "abstains, x* is a BIC-weighted mixture of the no-drift mean and the log-linear trend (`no-drift weight`; "
        + "`transfer/penalty.py: penalty_at_target`). "
        + f"Within 2× where the measured regret is resolved: {sum(calibration_verdict(r)[1] == 'within 2×' for r in d['rules'])} "
        + f"of {sum(calibration_verdict(r)[0] != '—' for r in d['rules'])}; "
        + f"consistent with a regret within noise: {sum(calibration_verdict(r)[1].startswith('consistent') for r in d['rules'])} "
        + f"of {sum(calibration_verdict(r)[0] == '—' for r in d['rules'])}.\n\n"
        + ct
        + "\n\n"
        + "\n".join(curves)
        + "\n"
    )


def _mup_sp_verdict(c: dict) -> str:
    """Claim: under µP the optimum does not move with width (slope within ±0.15 per e-fold of width),
    under SP it falls (slope below −0.15)."""
    m, sp = slope_interval(c["mup"]["optima"]), slope_interval(c["sp"]["optima"])
    vm = verdict(m[1], m[2], inside=(-0.15, 0.15)) if m else "inconclusive"
    vs = verdict(sp[1], sp[2], below=-0.15) if sp else "inconclusive"
    both = "reproduced" if vm == vs == "reproduced" else ("not reproduced" if "not reproduced" in (vm, vs) else "inconclusive")
    return (
        f"{_slope_text('µP', m)} → µP flat: {vm}; {_slope_text('SP', sp)} → SP drifts: {vs} "
        f"(95% intervals, claimed regions |slope| ≤ 0.15 and slope < −0.15). Verdict: **{both}**."
    )


def _wd_verdict(c: dict) -> str:
    """Claim: standard scaling drifts more than independent (|slope| larger by > 0.1)."""
    i, s = slope_interval(c["independent"]["optima"]), slope_interval(c["standard"]["optima"])
    if i is None or s is None:
        return "Verdict: **inconclusive** (fewer than 3 interior optima to fit a slope with an interval)."
    diff, half = abs(s[0]) - abs(i[0]), math.hypot((s[2] - s[1]) / 2, (i[2] - i[1]) / 2)
    v = "reproduced" if diff - half > 0.1 else ("not reproduced" if diff + half < 0.1 else "inconclusive")
    return (
        f"{_slope_text('independent', i)}, {_slope_text('standard', s)}; |standard| − |independent| = "
        f"{diff:+.2f} ± {half:.2f}. Verdict: **{v}**."
    )


def claims_section(d: dict) -> str:
    out = []
    c = d["mup_vs_sp"]
    rows = []
    for p in ("mup", "sp"):
        for w, o in sorted(c[p]["optima"].items(), key=lambda kv: int(kv[0])):
            rows.append([p, w, g(o["best_grid_lr"]), str(o["grid_index"]), g(o["fitted_lr"]), g(o["best_loss"]), g(o["on_edge"])])
    out.append(
        "### 1. µP keeps the optimum, SP drifts (Tensor Programs V, arXiv 2203.03466)\n\n"
        + md_table(["param.", "width", "best grid lr", "grid index", "fitted lr*", "best loss", "on edge"], rows)
        + f"\n\n{c['verdict']}\n\n"
        + _mup_sp_verdict(c)
        + "\n"
    )
    c = d["weight_decay"]
    rows = []
    for mode in ("independent", "standard"):
        for w, o in sorted(c[mode]["optima"].items(), key=lambda kv: int(kv[0])):
            rows.append([mode, w, g(o["best_grid_lr"]), g(o["fitted_lr"]), g(o["best_loss"])])
    out.append(
        "### 2. Independent vs standard weight-decay scaling (paper 3, arXiv 2510.19093)\n\n"
        + md_table(["wd scaling", "width", "best grid lr", "fitted lr*", "best loss"], rows)
        + f"\n\n{c['verdict']}.\n\n"
        + _wd_verdict(c)
        + f" {c['caveat']}\n"
    )
    c = d["dp_plateau"]
    bs = [r["B"] for r in next(iter(c["tables"].values()))["rows"]]
    rows = [
        [f"ε={eps}", *[g(r["sigma_sqrt_T"], ".3g") for r in t["rows"]], f"{100 * t['spread_over_B']:.0f}%"]
        for eps, t in c["tables"].items()
    ]
    s = c["setting"]
    out.append(
        f"### 3. σ√T plateau at tight ε, fall at loose ε (paper 1, arXiv 2510.20616)\n\nN={s['N']}, E={s['epochs']}, δ={s['delta']}, "
        f"{s['accountant']} accountant.\n\n"
        + md_table(["", *[f"B={b}" for b in bs], "spread over B"], rows)
        + f"\n\n{c['verdict']}. Verdict: **{'reproduced' if c['holds'] else 'not reproduced'}** — an exact "
        "accountant computation (no sampling noise), so no interval is needed.\n"
    )
    return "\n" + "\n".join(out)


def generic_section(d: dict) -> str:
    out = []
    scalars = [[k, g(v)] for k, v in d.items() if not isinstance(v, (dict, list)) and k not in ("date", "command", "figure")]
    if scalars:
        out.append(md_table(["field", "value"], scalars))

    def walk(obj, name: str, depth: int) -> None:
        if depth > 2:
            return
        if isinstance(obj, list) and obj and all(isinstance(r, dict) for r in obj):
            cols = [k for k in obj[0] if not isinstance(obj[0][k], (dict, list))][:10]
            out.append(
                f"**{name}**\n\n"
                + md_table(cols, [[r.get(k) for k in cols] for r in obj[:12]])
                + (f"\n\n({len(obj) - 12} more rows in the JSON)" if len(obj) > 12 else "")
            )
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{name}/{k}" if name else k, depth + 1)

    walk({k: v for k, v in d.items() if k != "machine"}, "", 0)
    return "\n" + "\n\n".join(out) + "\n"


def quickstart_section(d: dict) -> str:
    """Per seed: wall time and the target against its ladder and its predicted interval; the
    verdicts follow from those figures."""
    runs = [r for r in d["runs"] if r.get("returncode") == 0]
    failed = [r["seed"] for r in d["runs"] if r.get("returncode") != 0]
    rows = []
    for r in runs:
        iv = r.get("predicted_target_loss_interval")
        beats = r["target_val_loss"] < r["ladder_best_loss"] if r.get("ladder_best_loss") is not None else None
        inside = iv is not None and iv[0] <= r["target_val_loss"] <= iv[1]
        st = r.get("stage_times_s", {})
        rows.append(
            [
                str(r["seed"]),
                f"{r['wall_s']:.0f}",
                " / ".join(f"{st[k]:.0f}" for k in ("coord_check_s", "sweep_s", "train_s") if k in st),
                g(r["transferred_lr"]),
                g(r["target_val_loss"]),
                g(r["ladder_best_loss"]),
                f"[{g(iv[0])}, {g(iv[1])}]" if iv else "—",
                g(beats),
                g(inside),
                r["check"]["verdict"],
            ]
        )
    goal = d["setting"]["goal_wall_s"]
    walls = [r["wall_s"] for r in runs]
    tv = (
        "not measured"
        if not walls
        else ("met" if max(walls) <= goal else ("missed" if min(walls) > goal else "met on some seeds only"))
    )
    ok = [r for r in runs if r["check"]["verdict"] == "ok" and r["target_val_loss"] < r["ladder_best_loss"]]
    shown = "shown" if len(ok) == len(d["runs"]) and runs else "not shown"
    hp = next((r.get("hyperparameters") for r in runs if r.get("hyperparameters")), None)
    defaults = (
        f" Defaults: `model.hp_defaults: {d['hp_defaults']}`"
        + (f" (output_mult {g(hp['output_mult'])}, init_std {g(hp['init_std'])})" if hp else "")
        + "."
        if d.get("hp_defaults")
        else ""
    )
    return (
        f"\nWidths {d['setting']['widths']} → {d['setting']['target']}, {d['setting']['sweep_steps']} sweep steps, "
        f"{d['setting']['target_steps']} target steps, batch {d['setting']['batch']}, noise seeds {d['setting']['noise_seeds']}."
        f"{defaults}\n\n"
        + md_table(
            [
                "seed",
                "hpt run wall (s)",
                "coord check / sweep / train (s)",
                "transferred lr",
                "target val loss",
                "ladder best",
                "predicted interval",
                "beats ladder",
                "inside interval",
                "check_target",
            ],
            rows,
        )
        + f"\n\n`hpt run` ≤ {goal} s: **{tv}** (wall {', '.join(f'{w:.0f}' for w in walls)} s). "
        + f"Transfer working (target beats its ladder and lands inside the predicted interval on every seed): **{shown}** "
        + f"({len(ok)}/{len(d['runs'])} seeds)"
        + (f"; failed seeds: {failed}" if failed else "")
        + ".\n"
    )


SECTIONS = {
    "transfer_regret": regret_section,
    "paper_claims": claims_section,
    "quickstart": quickstart_section,
    "quickstart_package_defaults": quickstart_section,  # the quickstart before issue 36's family defaults
}
ORDER = ["transfer_regret", "paper_claims", "quickstart", "quickstart_package_defaults"]


# --- dp_lm (benchmarks/dp_lm.py): dp-plan vs grid best vs default, paper 1's directions ---------


def _ci_text(ci: dict | None, fmt: str = ".4g") -> str:
    """mean [lo, hi]; an open side (a censored optimum) shows as ∞."""
    if not ci:
        return "—"

    def end(x: float) -> str:
        return ("+∞" if x > 0 else "−∞") if math.isinf(x) else format(x, fmt)

    lo, hi = ci.get("lo"), ci.get("hi")
    return f"{format(ci['mean'], fmt)} [{end(lo)}, {end(hi)}]" if lo is not None else format(ci["mean"], fmt)


def _dp_lm_verdicts(v: dict) -> list[str]:
    """Each direction's verdict, derived here from the interval in the JSON (same rule as `verdict`)."""
    out = []
    a = v["a_plateau_at_tight_epsilon"]
    if "relative_slope" in a:
        ci, (lo_c, hi_c) = a["relative_slope"], a["claim_region"]
        va = verdict(ci["lo"], ci["hi"], inside=(lo_c, hi_c)) if ci["lo"] is not None else "inconclusive"
        why = (
            f"relative slope of loss per doubling of B over B = {a['batch_sizes']}: {_ci_text(ci, '+.4f')}, flat region ±{hi_c:g}"
        )
    else:
        va, why = "inconclusive", a.get("why", "")
    out.append(f"- (a) ε = {a['epsilon']:g}, loss flat in B where σ√T is flat: {why} → **{va}**")
    b = v["b_larger_batch_better_at_loose_epsilon"]
    if "relative_slope" in b:
        ci = b["relative_slope"]
        vb = verdict(ci["lo"], ci["hi"], below=0.0) if ci["lo"] is not None else "inconclusive"
        why = f"relative slope of loss per doubling of B over B = {b['batch_sizes']}: {_ci_text(ci, '+.4f')}, claim < 0"
    else:
        vb, why = "inconclusive", b.get("why", "")
    out.append(f"- (b) ε = {b['epsilon']:g}, larger B is better: {why} → **{vb}**")
    c = v["c_larger_clip_at_tight_epsilon"]
    d = c["log_ratio"]
    vc = verdict(-d["hi"], -d["lo"], below=0.0)
    optima = "; ".join(
        f"ε={e}: C* = {g(o['value'], '.3g')} at B = {o['batch_size']}" + (f" ({o['censored']} bound)" if o["censored"] else "")
        for e, o in c["optima"].items()
    )
    out.append(
        f"- (c) the best C is larger at smaller ε: log C*(ε={c['epsilons'][0]:g}) − log C*(ε={c['epsilons'][1]:g}) = "
        f"{_ci_text(d, '+.3f')}, claim > 0 ({optima}) → **{vc}**"
    )
    return out


def dp_lm_section(d: dict) -> str:
    s = d["setting"]
    rows = [
        [
            g(r["epsilon"]),
            r["choice"],
            g(r["batch_size"]),
            f"{g(r['clip'], '.3g')} ({g(r['clip_over_ref'], '.3g')}×)",
            g(r["lr"], ".3g"),
            g(r["steps"]),
            g(r["sigma"], ".3g"),
            g(r["sigma_sqrt_T"], ".3g"),
            _ci_text({"mean": r["val_loss"], "lo": r["ci_low"], "hi": r["ci_high"]}) if r["val_loss"] is not None else "—",
            r["note"] or "—",
        ]
        for r in d["rows"]
    ]
    comps = [
        [
            g(c["epsilon"]),
            _ci_text(c["plan_minus_grid_best"], "+.4f"),
            _ci_text(c["plan_minus_default"], "+.4f") if c["plan_minus_default"] else c["default_note"] or "—",
        ]
        for c in d["comparisons"]
    ]
    sst = [[f"ε={e}", *[g(t["sigma_sqrt_T"], ".3g") for t in ts]] for e, ts in d["sigma_sqrt_T"].items()]
    bs = [t["B"] for t in next(iter(d["sigma_sqrt_T"].values()))]
    return (
        f"\n{s['model']}; {s['corpus']}; E = {s['epochs']} epochs, δ = {s['delta']:g}, {s['accountant']} accountant, "
        f"min_steps {s['min_steps']}; C grid = reference {s['clip_reference']:g} × {s['clip_factors']} (extended upward as ε falls); "
        f"{s['lr_rule']}; seeds {s['seeds']}; {d['runs']} runs, max ε spent / target = {g(d['max_epsilon_spent_over_target'], '.4f')}.\n\n"
        + md_table(["ε", "choice", "B", "C (× ref)", "lr", "T", "σ", "σ√T", "val loss, mean [95% t-interval]", "note"], rows)
        + "\n\nPaired by seed (mean [95% t-interval]); the grid best is chosen on the same seeds, so it is optimistic:\n\n"
        + md_table(["ε", "plan − grid best", "plan − default"], comps)
        + "\n\nσ√T over the batch sizes:\n\n"
        + md_table(["", *[f"B={b}" for b in bs]], sst)
        + "\n\nPaper 1's directions (arXiv 2510.20616), verdicts from the intervals:\n\n"
        + "\n".join(_dp_lm_verdicts(d["verdicts"]))
        + "\n"
    )


SECTIONS["dp_lm"] = dp_lm_section


# --- dp_finetune (benchmarks/dp_finetune.py): the plan on a pretrained model, paired on held-out seeds ---


def _side(ci: dict | None) -> str:
    """plan − other, read from its interval: which side of 0."""
    if not ci or ci.get("lo") is None:
        return "—"
    return "plan better" if ci["hi"] < 0 else "plan worse" if ci["lo"] > 0 else "within noise"


def _dp_finetune_verdicts(v: dict) -> list[str]:
    """Each direction's verdict, recomputed from its interval (same rule as `verdict`)."""
    out = []
    for name, x in v.items():
        ci = x.get("relative_slope") or x.get("slope_difference")
        if name.startswith("a_"):
            what = f"(a) ε = {x['epsilon']:g}, E = {x['epochs']:g}: loss flat in B over B = {x['batch_sizes']} (σ√T within 5% of its minimum)"
            lo_c, hi_c = x["claim_region"]
            vd = verdict(ci["lo"], ci["hi"], inside=(lo_c, hi_c)) if ci and ci["lo"] is not None else "inconclusive"
            detail = f"relative slope per doubling {_ci_text(ci, '+.4f')}, flat region ±{hi_c:g}" if ci else x.get("why", "")
        elif name.startswith("b_"):
            what = f"(b) ε = {x['epsilon']:g}, E = {x['epochs']:g}: larger B is better"
            vd = verdict(ci["lo"], ci["hi"], below=0.0) if ci and ci["lo"] is not None else "inconclusive"
            detail = f"relative slope per doubling {_ci_text(ci, '+.4f')}, claim < 0" if ci else x.get("why", "")
        elif name.startswith("c_"):
            d = x["log_ratio"]
            what = f"(c) E = {x['epochs']:g}: the best C is larger at ε = {x['epsilons'][0]:g} than at ε = {x['epsilons'][1]:g}"
            vd = verdict(-d["hi"], -d["lo"], below=0.0)
            optima = "; ".join(
                f"ε={e}: C* = {g(o['value'], '.3g')} at B = {o['batch_size']}"
                + (f" ({o['censored']} bound)" if o["censored"] else "")
                for e, o in x["optima"].items()
            )
            detail = f"log C* difference {_ci_text(d, '+.3f')}, claim > 0 ({optima})"
        else:
            what = f"(d) ε = {x['epsilon']:g}: more epochs make larger B viable (slope at E = {x['epochs'][1]:g} minus at E = {x['epochs'][0]:g})"
            vd = verdict(ci["lo"], ci["hi"], below=0.0) if ci and ci["lo"] is not None else "inconclusive"
            detail = f"{_ci_text(ci, '+.4f')}, claim < 0" if ci else ""
        out.append(f"- {what}: {detail} → **{vd}**")
    return out


def dp_finetune_section(d: dict) -> str:
    s = d["setting"]
    comps = []
    for c in d["comparisons"]:
        pmd, pmg = c["plan_minus_default"], c["plan_minus_grid_best"]
        gb = c.get("grid_best") or {}
        comps.append(
            [
                g(c["epsilon"]),
                g(c["epochs"]),
                f"{c['plan']['batch_size']} / {g(c['plan']['clip'], '.3g')}",
                f"{g(gb.get('batch_size'))} / {g(gb.get('clip'), '.3g')}",
                _ci_text(pmd, "+.4f"),
                _side(pmd),
                _ci_text(pmg, "+.4f"),
                _side(pmg),
            ]
        )
    rows = [
        [
            g(r["epsilon"]),
            g(r["epochs"]),
            r["choice"],
            g(r["batch_size"]),
            f"{g(r['clip'], '.3g')} ({g(r['clip_over_median'], '.2g')}×)",
            g(r["lr"], ".3g"),
            g(r["steps"]),
            g(r["sigma_sqrt_T"], ".3g"),
            _ci_text({"mean": r["val_loss"], "lo": r["ci_low"], "hi": r["ci_high"]}) if r["val_loss"] is not None else "—",
        ]
        for r in d["rows"]
    ]
    goal = d["goal"]
    ok_d = all(
        c["plan_minus_default"] and c["plan_minus_default"]["lo"] is not None and c["plan_minus_default"]["lo"] <= 0
        for c in d["comparisons"]
    )
    ok_g = all(
        c["plan_minus_grid_best"] and c["plan_minus_grid_best"]["lo"] is not None and c["plan_minus_grid_best"]["lo"] <= 0
        for c in d["comparisons"]
    )
    pre = d.get("pretraining", {})
    if not s["selection_seeds"]:  # the held-out check: no grid
        ok_g = None
    goal_text = (
        f"\n\nGoal (every plan − default lo ≤ 0: **{'met' if ok_d else 'not met'}**; every plan − grid best lo ≤ 0: "
        + (
            f"**{'met' if ok_g else 'not met'}**) → **{'met' if ok_d and ok_g else 'not met'}**"
            if ok_g is not None
            else "no grid in this held-out run) → plan vs default **" + ("met" if ok_d else "not met") + "**"
        )
        + ("" if goal.get("met") == (ok_d and ok_g is not False) else " (differs from the JSON's goal: rerun the benchmark)")
    )
    return (
        f"\n{s['model']}, pretrained (non-privately: {pre.get('pretrain_steps')} steps of {pre.get('pretrain_batch')} on the "
        f"{s['public_corpus']}; public val loss {g(pre.get('public_val_loss'), '.4f')}), then DP-fine-tuned on the "
        f"{s['private_corpus']}; δ = {s['delta']:g}, {s['accountant']} accountant; {s['lr_rule']} in every arm; C grid = "
        f"median measured norm {g(s['clip_reference_median_norm'], '.4g')} × {s['clip_factors']}; default B = "
        f"{s['default']['batch_size']}, C = {s['default']['clip']:g}. "
        + (
            f"Grid on seeds {s['selection_seeds']}, the grid best chosen there; plan, default and grid best"
            if s["selection_seeds"]
            else "Held-out check of the rules (changed after dp_finetune's first run): no grid; plan and default"
        )
        + f" scored on seeds {s['scoring_seeds']}; the plan's evidence from seeds "
        f"{s['pilot_seeds']}. {d['n_runs']} runs, max ε spent / target = {g(d['max_epsilon_spent_over_target'], '.4f')}"
        + ("" if d.get("complete", True) else f" — **incomplete**: {d.get('missing_runs', '?')} runs missing")
        + ".\n\nPaired by seed on the scoring seeds (mean [95% t-interval]); B / C of each choice:\n\n"
        + md_table(["ε", "E", "plan B / C", "grid best B / C", "plan − default", "", "plan − grid best", ""], comps)
        + goal_text
        + ".\n\n"
        + md_table(["ε", "E", "choice", "B", "C (× median)", "lr", "T", "σ√T", "val loss on scoring seeds [95% t]"], rows)
        + (
            "\n\nPaper 1's directions in the fine-tuning regime (grid, selection seeds), verdicts from the intervals:\n\n"
            + "\n".join(_dp_finetune_verdicts(d["verdicts"]))
            if d["verdicts"]
            else ""
        )
        + "\n"
    )


SECTIONS["dp_finetune"] = dp_finetune_section
SECTIONS["dp_finetune_heldout"] = dp_finetune_section


# --- depth_regret (benchmarks/depth_regret.py): LR* against depth, regret at the target ------------


def _lr_ci(o: dict | None) -> str:
    if not o:
        return "—"
    lo, hi = o["ci"]
    cen = {"upper": " (≤: grid's low edge)", "lower": " (≥: grid's high edge)"}.get(o.get("censored"), "")
    return f"{o['lr']:.3g} [{g(lo, '.3g')}, {g(hi, '.3g') if hi is not None else '∞'}]{cen}"


def depth_regret_section(d: dict) -> str:
    """Per parametrization: the optimum per depth with its interval, the slope of log LR* against
    log depth, the paired regret at the target; the verdicts recomputed from those intervals."""
    from depth_regret import REGRET_CEILING, verdicts

    s = d["setting"]
    depths = [str(x) for x in s["depths"]]
    rows = []
    for par, c in d["curves"].items():
        sl = c["slope"]
        r = d["regret"][par]
        reg = "—" if r.get("regret") is None else f"{_pct(r['regret'])} {_ci_pct(r.get('regret_ci'))}"
        rows.append(
            [
                par,
                *[_lr_ci(c["optima"].get(x)) for x in depths],
                "—" if not sl else f"{sl['slope']:+.2f} [{sl['ci'][0]:+.2f}, {sl['ci'][1]:+.2f}]",
                _lr_ci(r.get("direct")),
                g(r.get("best_direct_lr"), ".3g"),
                reg,
                verdict(*(r.get("regret_ci") or (None, None)), below=REGRET_CEILING) if r.get("regret") is not None else "—",
            ]
        )
    n = d.get("target_noise") or {}
    noise = (
        f"Target noise (width {s['target_width']}, depth {s['target_depth']}, completep at the transferred LR, seeds "
        f"{s['noise_seeds']}): losses {', '.join(f'{x:.4f}' for x in n['losses'])}, seed SD {n['seed_sd']:.4f} "
        f"({100 * n['relative_sd']:.2f}% of the loss)."
        if n
        else "Target noise: not measured."
    )
    v = verdicts(d["curves"])
    missing = d.get("missing_runs") or []
    at = d.get("at_transferred_lr") or {}
    paired = [
        f"- {p} − none: {m['mean']:+.4f} [{m['ci'][0]:+.4f}, {m['ci'][1]:+.4f}] (n={m['n']}; lower than none: "
        f"**{verdict(m['ci'][0], m['ci'][1], below=0.0)}**)"
        for p, m in at.get("minus_none", {}).items()
    ]
    if at:
        losses = "; ".join(f"{p}: {', '.join(g(x, '.4f') for x in ls)}" for p, ls in at["losses"].items())
        paired = [
            f"At the target with the transferred LR {g(at['lr'], '.4g')} (seeds {s['noise_seeds']}): {losses}. Paired by seed:",
            "",
        ] + paired
    return (
        f"\nllama, µP in width (base width {s['base_width']}, head_dim {s['head_dim']}), base depth {s['base_depth']}; ladder widths "
        f"{s['ladder_widths']} at depth {s['base_depth']}; LR-vs-depth curves at width {s['curve_width']}, depths {s['depths']}, "
        f"seeds {s['seeds']}; target width {s['target_width']} depth {s['target_depth']} (direct sweep seeds {s['direct_seeds']}, "
        f"then {s['noise_seeds']} at its best LR); {s['steps']} steps, batch {s['batch']} × seq {s['seq_len']}. "
        f"Transferred LR (the ladder's optimum at width {max(s['ladder_widths'])}, used as is): {g(d.get('transferred_lr'), '.4g')}.\n\n"
        + noise
        + "\n\n"
        + md_table(
            [
                "parametrization",
                *[f"LR* at L={x} [95%]" for x in depths],
                "slope d log LR* / d log L [95%]",
                f"target LR* (L={s['target_depth']}) [95%]",
                "best direct LR",
                "regret of the transferred LR, paired [95% t]",
                f"regret < {100 * REGRET_CEILING:g}%",
            ],
            rows,
        )
        + ("\n\n" + "\n".join(paired) if paired else "")
        + "\n\nVerdicts, from the slope intervals:\n\n"
        + "\n".join(f"- {k}: **{x}**" for k, x in v.items())
        + (f"\n\n{len(missing)} runs missing from the cache (not trained): see `missing_runs` in the JSON." if missing else "")
        + "\n"
    )


SECTIONS["depth_regret"] = depth_regret_section


# --- joint_regret (benchmarks/joint_regret.py): joint search vs LR grid vs SP tuned at the target ---


def _pm(p: dict, fmt: str = "+.4f", scale: float = 1.0) -> str:
    """mean [lo, hi] of a paired difference (× scale); a missing bound shows as —."""
    f = lambda x: "—" if x is None else format(scale * x, fmt)
    return f"{f(p['mean'])} [{f(p['ci'][0])}, {f(p['ci'][1])}]"


def _per_width(c: dict | None) -> str:
    return "—" if not c else "/".join(str(v) for v in c["trials"].values())


def _arm_rows(targets: dict) -> list[list]:
    """One row per arm: its settings, its target loss [95% t] (n) and its first per-seed losses."""
    rows = []
    for n, t in targets.items():
        hp, m = t["hyperparameters"], t["mean"]
        per = ", ".join(g(x, ".4f") for x in t["losses"][:5]) + (
            f", … ({len(t['losses'])} seeds)" if len(t["losses"]) > 5 else ""
        )
        ci = (
            "—"
            if not m
            else f"{m['mean']:.4f} [{g(m['lo'], '.4f')}, {g(m['hi'], '.4f')}]" + (f" (n={m['n']})" if m.get("n") else "")
        )
        rows.append(
            [f"({n}) {t['name']}", *[g(hp[k], ".4g") for k in ("lr", "output_mult", "init_std", "warmup_steps")], ci, per]
        )
    return rows


def _cmp_rows(paired: dict, regret_label) -> list[list]:
    """One row per paired difference: a loss difference, or a relative regret in % (keys `regret_*`,
    labelled by regret_label(key)), with n and the verdict read from its interval."""
    from joint_regret import direction

    rows = []
    for k, p in paired.items():
        if p:
            rel = k.startswith("regret")
            label = regret_label(k) if rel else f"({k[0]}) − ({k[2]})"
            rows.append([label, _pm(p, "+.2f", 100.0) + " %" if rel else _pm(p), p["n"], direction(*p["ci"])])
    return rows


def _tables_and_verdicts(first: str, rows: list, cmp_rows: list, verdict_items: dict, d: dict) -> str:
    """The arm table, the paired table, the verdicts and, for a partial result, what is missing."""
    parts = d.get("parts_done", {})
    return (
        md_table([first, "lr", "output_mult", "init_std", "warmup_steps", "target loss [95% t]", "per seed"], rows)
        + "\n\n"
        + md_table(["paired difference (lower is better)", "mean [95% t]", "n", "verdict"], cmp_rows)
        + "\n\nVerdicts, from the intervals:\n\n"
        + "\n".join(f"- {k}: **{x}**" for k, x in verdict_items.items())
        + (
            ""
            if d.get("complete")
            else "\n\n**Incomplete** (`complete: false`): not yet run: "
            + (", ".join(k for k, v in parts.items() if not v) or "some runs")
            + "; rerun the command: the cache resumes it."
        )
        + "\n"
    )


def joint_regret_section(d: dict) -> str:
    """Each plan's settings and target loss (95% t over seeds), the paired differences, and the
    verdicts recomputed here from those intervals."""
    from joint_regret import verdicts

    s = d["setting"]
    rows = _arm_rows(d["targets"])
    cmp_rows = _cmp_rows(d["paired"], lambda k: "(b) − (d), relative: regret against a direct joint search")
    lad = d["ladders"]
    comp = d.get("compute", {})
    opt = (lad.get("joint") or {}).get("sweep", {}).get("optuna") or {}
    fits = []
    for w, hps in ((lad.get("joint") or {}).get("optimum_by_width") or {}).items():
        first = next(iter(hps.values()), {})
        fits.append(
            f"width {w}: " + (f"fallback to the best point ({first['fallback']})" if first.get("fallback") else "joint fit")
        )
    ds, dnote = d.get("direct_search") or {}, ""
    if "d" not in d["targets"]:
        done = len(ds.get("trials", []))
        dnote = (
            f" (d) not measured: {ds['left_out']}"
            if ds.get("left_out")
            else f" (d) not measured: {done} of {s['direct_trials']} direct-search trials done when the run stopped."
        )
    return (
        f"\nllama, depth {s['depth']}, head size {s['head_dim']}, µP base width {s['ladder'][0]}; ladder widths {s['ladder']}, target "
        f"width {s['target']}; {s['steps']} steps, batch {s['batch']} × seq {s['seq']}, weight decay {g(s['wd'])}. Ladder compute, "
        f"trials per width {'/'.join(map(str, s['ladder']))}: (a) {_per_width(comp.get('grid'))} ({len(s['grid_lrs'])} LRs × {len(s['grid_seeds'])} seeds + "
        f"{s['noise_seeds']} replicates), (b) {_per_width(comp.get('joint'))} (Optuna TPE, {opt.get('trials_per_width')} trials "
        f"per width, budget_decay {opt.get('budget_decay', '—')}, warm start {opt.get('warm_start_points', '—')} points, "
        f"{opt.get('max_concurrent')} at once, + {s['noise_seeds']} replicates), each trial {s['steps']} steps. (b)'s box: "
        + ", ".join(f"{k} [{g(a)}, {g(b)}]" for k, (a, b) in s["box"].items())
        + f". (c): SP LR grid at the target on seeds {s['select_seeds']}, best scored on others; (d): Optuna TPE at the target, "
        f"{s['direct_trials']} trials on seed {s['direct_seed']}, its best scored. Every target run on seeds {s['score_seeds']}, "
        "paired by seed. (b)'s plan: "
        + ("; ".join(fits) or "—")
        + "."
        + dnote
        + "\n\n"
        + _tables_and_verdicts("plan", rows, cmp_rows, verdicts(d["paired"]), d)
    )


SECTIONS["joint_regret"] = joint_regret_section


# --- default_regret (benchmarks/default_regret.py): the default plan vs what a user has without us ---


def default_regret_section(d: dict) -> str:
    """Each arm's settings and target loss, the paired differences (the regrets relative, in %) and
    the issue's verdicts, recomputed here from the intervals."""
    from default_regret import verdicts

    s = d["setting"]
    rows = _arm_rows(d["targets"])
    cmp_rows = _cmp_rows(d["paired"], lambda k: f"({k.split('_')[1]}) vs (e), relative: regret")
    return (
        f"\nllama, depth {s['depth']}, head size {s['head_dim']}, µP base width {s['ladder'][0]}; ladder widths {s['ladder']}, target "
        f"width {s['target']} ({s['target'] // s['ladder'][-1]}× the widest swept); {s['steps']} steps, batch {s['batch']} × seq "
        f"{s['seq']}, weight decay {g(s['wd'])}, warmup {s['warmup']}. (a), (b): the product's LR-grid sweep and plan "
        f"({len(s['grid_lrs'])} LRs × {len(s['grid_seeds'])} seeds + {s['noise_seeds']} replicates per width, formula prior as "
        f"`hpt run` makes it), at the package defaults (a) or the family's (b). (c): SP LR grid at the target on seeds "
        f"{s['select_seeds']}, best scored on others. (d): SP at Step Law's LR {g(d.get('step_law_lr'))}. (e): Optuna TPE at the "
        f"target, {s['direct_trials']} trials on seed {s['direct_seed']} over "
        + ", ".join(f"{k} [{g(a)}, {g(b)}]" for k, (a, b) in s["box"].items())
        + f", its best re-scored. Every target run on seeds {s['score_seeds']}"
        + (f"; (b) and (e) also on seeds up to {max(s['regret_seeds'])} for (b)'s regret" if s.get("regret_seeds") else "")
        + ", paired by seed (each pair on the seeds both have).\n\n"
        + _tables_and_verdicts("arm", rows, cmp_rows, verdicts(d["paired"]), d)
    )


SECTIONS["default_regret"] = default_regret_section


# --- axes_regret (benchmarks/axes_regret.py): width-only vs multi-axis vs the free formulas ---


def axes_regret_section(d: dict) -> str:
    """Every plan's regret against the LR tuned at the target (95% t over seeds) with its verdict on
    the 1% goal, and the paired differences the issue names, recomputed here from the per-seed losses."""
    from joint_regret import direction

    s, plans = d["setting"], {p["name"]: p for p in d["plans"]}
    rows = []
    for p in d["plans"]:
        m, r = t_interval(p["target_losses"]), p["relative_regret"]
        rows.append(
            [
                p["name"],
                g(p["lr"], ".4g"),
                f"{m.mean:.4f} [{m.lo:.4f}, {m.hi:.4f}]",
                f"{100 * r['mean']:+.2f} % [{100 * r['lo']:+.2f}, {100 * r['hi']:+.2f}]",
                verdict(r["lo"], r["hi"], below=0.01),
            ]
        )
    pairs = []
    for a, b in (("multi-axis", "width-only (before issue 23)"), ("step_law", "multi-axis"), ("deepseek", "multi-axis")):
        if a in plans and b in plans:
            diff = t_interval([x - y for x, y in zip(plans[a]["target_losses"], plans[b]["target_losses"])])
            pairs.append(
                [f"{a} − {b}", f"{diff.mean:+.4f} [{diff.lo:+.4f}, {diff.hi:+.4f}]", diff.n, direction(diff.lo, diff.hi)]
            )
    direct = d.get("direct") or {}
    t = s["target"]
    return (
        f"\n{s['family']}, depth {s['depth']}, head size {s['head_dim']}; ladder widths {s['ladder']} (steps and batch arms "
        f"{s['arms']} at width {s['arm_width']}), target width {t['width']}, {t['steps']} steps, batch {t['batch_size']}; "
        f"seeds {s['seeds']}. Regret: each plan's target loss against the best LR of a direct grid at the target "
        f"({g(direct.get('best_lr'))}, loss {g(direct.get('best_loss'), '.4f')}), relative, 95% t over seeds; verdict on "
        "regret ≤ 1% (reproduced when the whole interval is below).\n\n"
        + md_table(["plan", "lr", "target loss [95% t]", "regret [95% t]", "regret ≤ 1%"], rows)
        + "\n\n"
        + md_table(["paired difference, loss (lower is better)", "mean [95% t]", "n", "verdict"], pairs)
        + "\n\nVerdicts in the JSON:\n\n"
        + "\n".join(f"- {k}: **{v}**" for k, v in d.get("verdicts", {}).items())
        + "\n"
    )


SECTIONS["axes_regret"] = axes_regret_section


# --- joint_pooled (benchmarks/joint_pooled.py): the pooled joint estimate vs the per-width one ---


def joint_pooled_section(d: dict) -> str:
    """Both estimates from the same ladder, scored at the target; pairs with joint_regret's stored
    plans only when the determinism check passed."""
    rows = []
    names = {"b_pooled": "(b) pooled estimate (now)", "b_per_width": "(b) per-width estimate (before), same points"}
    names.update({k: f"variant: {v}" for k, v in d.get("variants", {}).items()})
    for n, t in d["targets"].items():
        hp, m = t["hyperparameters"], t["mean"]
        rows.append(
            [
                names.get(n, n),
                *[g(hp[k], ".4g") for k in ("lr", "output_mult", "init_std", "warmup_steps")],
                f"{m['mean']:.4f} [{g(m['lo'], '.4f')}, {g(m['hi'], '.4f')}]",
            ]
        )
    for n, t in d.get("stored", {}).items():
        hp, m = t["hyperparameters"], t["mean"]
        rows.append(
            [
                f"({n}) {t['name']} (stored, joint_regret.json)",
                *[g(hp[k], ".4g") for k in ("lr", "output_mult", "init_std", "warmup_steps")],
                f"{m['mean']:.4f} [{g(m['lo'], '.4f')}, {g(m['hi'], '.4f')}]",
            ]
        )
    cmp_rows = []
    for k, p in d["paired"].items():
        if p:
            rel = k.startswith("regret")
            cmp_rows.append([k, _pm(p, "+.2f", 100.0) + " %" if rel else _pm(p), p["n"], p["verdict"]])
    det = d["determinism"]
    pf, pw = d["pooled_fit"], d["per_width_fit"]
    return (
        f"\nThe ladder of joint_regret.py's (b) swept again; its plan from the pooled fit: {pf.get('model') or '—'}"
        + (f"; undecided: {', '.join(pf['undecided'])}" if pf.get("undecided") else "")
        + (f"; fallback: {pf['fallback']}" if pf.get("fallback") else "")
        + f". The per-width fit on the same points: {pw.get('fallback') or 'a fitted vertex'}. Determinism check "
        f"({det['run']} trained again): {det['again']:.6f} vs stored {det['stored']:.6f}, "
        f"{'the same' if det['same'] else 'different: no pairing with stored runs'}."
        + (f" **Note**: {d['same_point_note']}." if d.get("same_point_note") else "")
        + "\n\n"
        + md_table(["plan", "lr", "output_mult", "init_std", "warmup_steps", "target loss [95% t]"], rows)
        + "\n\n"
        + md_table(["paired difference (lower is better)", "mean [95% t]", "n", "verdict"], cmp_rows)
        + "\n\nVerdicts, from the intervals:\n\n"
        + "\n".join(f"- {k}: **{x}**" for k, x in d["verdicts"].items())
        + "\n"
    )


SECTIONS["joint_pooled"] = joint_pooled_section


# --- wheel_install (benchmarks/wheel_install.py): the wheel into a clean venv with the user's torch ---


# --- dp_tuning_modes (benchmarks/dp_tuning_modes.py): public vs private tuning vs a default, equal total ε ---


def _choices(runs: list[dict]) -> str:
    """The settings an arm ran with over its replicates: each (B, lr) with its count, C's range."""
    from collections import Counter

    if not runs:
        return "—"
    bl = Counter((r["batch_size"], r["lr"]) for r in runs)
    cs = [r["clip"] for r in runs]
    pairs = ", ".join(f"B={b} lr={lr:g} ×{k}" for (b, lr), k in bl.most_common())
    c = f"C={min(cs):.3g}" if max(cs) / min(cs) < 1.001 else f"C {min(cs):.3g}–{max(cs):.3g}"
    return f"{pairs}; {c}"


def dp_tuning_modes_section(d: dict) -> str:
    out = []
    for e in d["per_epsilon"]:
        rows = []
        for arm, runs in e["arms"].items():
            tot = [r["epsilon_total"] for r in runs]
            rows.append(
                [
                    arm,
                    _ci_text(e["mean_eval_loss"].get(arm)),
                    _choices(runs),
                    f"{max(tot):.3g}" if tot else "—",
                    len(runs),
                ]
            )
        pairs = [
            [k, _ci_text(v, "+.4f") if v.get("mean") is not None else "—", v["n"], f"**{v['verdict']}**"]
            for k, v in e["paired"].items()
        ]
        same = ", ".join(f"{k}: {v} of {d['settings']['replicates']}" for k, v in e["same_algorithm"].items())
        note = f"\n\nPrivate tuning refused at this budget: {e['private_infeasible']}" if e.get("private_infeasible") else ""
        out.append(
            f"**total ε = {e['epsilon']:g}** (δ {d['settings']['delta']:g})\n\n"
            + md_table(["arm", "held-out loss, mean [95% t]", "settings run", "max whole-study ε", "replicates"], rows)
            + "\n\n"
            + md_table(["paired difference (loss)", "mean [95% t]", "n", "verdict"], pairs)
            + f"\n\nSame algorithm (same B and lr, C within 5%) in: {same}.{note}"
        )
    return "\n" + "\n\n".join(out) + "\n"


SECTIONS["dp_tuning_modes"] = dp_tuning_modes_section


def wheel_install_section(d: dict) -> str:
    rows = [
        ["install command", f"`{d.get('install_command', '—')}`"],
        ["wheel build", f"{g(d['build_s'])} s"],
        ["the user's torch into the fresh venv (not ours)", f"{g(d['user_torch_s'])} s"],
        ["install of the wheel and its dependencies", f"{g(d['install_s'])} s"],
        [
            "torch before → after",
            f"{d['torch']['before']} → {d['torch']['after']} ({'kept' if d['torch']['kept'] else 'REPLACED'})",
        ],
        ["torchvision importable", {True: "yes", False: "no (hidden by hptransfer)", None: "—"}[d.get("torchvision_imports")]],
        ["`hpt --help`", "ok" if d["help_ok"] else "failed"],
        ["`hpt run` of the tiny end-to-end spec", f"{'ok' if d['run_ok'] else 'failed'}, {g(d['run_s'])} s"],
        ["verdict", f"**{d['verdict']}**"],
    ]
    return "\n" + md_table(["step", "result"], rows) + "\n"


SECTIONS["wheel_install"] = wheel_install_section
SECTIONS["wheel_install_naive"] = wheel_install_section


def render() -> str:
    paths = sorted(RESULTS.glob("*.json"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
    parts = [
        "# Benchmarks",
        "",
        "Generated by `.venv/bin/python benchmarks/make_benchmarks_md.py` from `benchmarks/results/*.json`; "
        "do not edit by hand. Each section names the command that reproduces it, the machine and the date. "
        "Measured on a shared 2-core CPU VM unless a section says otherwise: wall times are upper bounds, "
        "and losses come from one seed per point unless a row says otherwise. "
        "The papers and formulas behind each benchmark: [docs/RESEARCH.md](docs/RESEARCH.md).",
        "",
    ]
    parts += [f"- [{p.stem}](#{p.stem.replace('_', '_')})" for p in paths]
    for p in paths:
        d = json.loads(p.read_text())
        parts.append("\n" + header(p.stem, d, p))
        try:
            parts.append(SECTIONS.get(p.stem, generic_section)(d))
        except (KeyError, TypeError) as e:  # an older result without a field: still list it
            parts.append(f"\n(could not render the tables: missing field {e}; rerun the benchmark)\n" + generic_section(d))
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 (with a diff) if BENCHMARKS.md differs")
    args = ap.parse_args(argv)
    from hptransfer.io import write_atomic

    path, text = ROOT / "BENCHMARKS.md", render()
    if args.check:
        old = path.read_text() if path.exists() else ""
        if old != text:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True), str(path), "generated"))
            raise SystemExit(f"{path} is not what benchmarks/results/*.json give: rerun benchmarks/make_benchmarks_md.py")
        print(f"{path} is up to date")
        return path
    write_atomic(path, text)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
