"""Generate BENCHMARKS.md from benchmarks/results/*.json: for every result, the command that
reproduces it, the machine it ran on, the date, its figure and its numbers. Nothing is typed by
hand: rerun a benchmark, then this script.

`transfer_regret` and `paper_claims` get their own tables; any other result is rendered
generically (scalars, and lists of records as tables), so a new benchmark shows up without edits.

Run: .venv/bin/python benchmarks/make_benchmarks_md.py   → BENCHMARKS.md
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


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


def header(stem: str, d: dict, path: Path) -> str:
    title, run = script_doc(stem)
    date = d.get("date") or (
        dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).isoformat(timespec="seconds") + " (file time)"
    )
    m = d.get("machine")
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
    out = "\n".join(lines) + "\n"
    if fig:
        out += f"\n![{stem}]({fig})\n"
    return out


# --- verdicts, derived here from intervals (never typed by hand) --------------------------------


def slope_interval(optima: dict) -> tuple[float, float, float] | None:
    """Slope of log lr* against log width with its 95% interval (t, n−2 dof), recomputed from the
    per-width optima in the JSON; optima on the grid edge are bounds, not points, and are left out."""
    from scipy.stats import t as student

    from hptransfer.transfer.diagnostics import fit_log_linear

    pts = sorted((int(w), o["fitted_lr"]) for w, o in optima.items() if not o.get("on_edge"))
    if len(pts) < 3:
        return None
    f = fit_log_linear([w for w, _ in pts], [math.log(v) for _, v in pts])
    q = student.ppf(0.975, len(pts) - 2)
    return f.b, f.b - q * f.b_se, f.b + q * f.b_se


def verdict(lo: float, hi: float, *, inside: tuple[float, float] | None = None, below: float | None = None) -> str:
    """reproduced when the whole interval satisfies the claim, not reproduced when none of it does,
    inconclusive otherwise (the noise is larger than the effect)."""
    if inside is not None:
        a, b = inside
        if a <= lo and hi <= b:
            return "reproduced"
        return "not reproduced" if hi < a or lo > b else "inconclusive"
    if hi < below:
        return "reproduced"
    return "not reproduced" if lo >= below else "inconclusive"


def _slope_text(name: str, si) -> str:
    return f"{name} slope " + ("— (fewer than 3 interior optima)" if si is None else f"{si[0]:+.2f} [{si[1]:+.2f}, {si[2]:+.2f}]")


def _regret_verdict(d: dict) -> str:
    """Regret claims need an interval: with fewer than 3 seeds per point there is none."""
    s = d["setting"]
    seeds = s.get("seeds") or [s.get("seed")]
    if len(seeds) < 3 or not any("regret_ci" in r for r in d["rules"]):
        return (
            f"**Verdict: inconclusive for every rule** — {len(seeds)} seed(s) per point, so no regret carries an "
            "interval and a difference below the seed-to-seed noise cannot be told from zero (docs/RESEARCH.md, "
            '"Measuring transfer honestly").\n\n'
        )
    out = []
    for r in d["rules"]:
        lo, hi = r["regret_ci"]
        v = "reproduced" if hi <= 0.01 else ("not reproduced" if lo > 0.01 else "inconclusive")
        out.append(f"{r['name']}: {100 * r['relative_regret']:+.2f}% [{100 * lo:+.2f}, {100 * hi:+.2f}] → {v}")
    return "Regret ≤ 1% (95% intervals): " + "; ".join(out) + ".\n\n"


def regret_section(d: dict) -> str:
    s = d["setting"]
    rows = [
        [
            r["name"],
            r["parametrization"],
            g(r["transferred_lr"]),
            g(r["target_loss"]),
            g(r["best_direct_lr"]),
            g(r["best_direct_loss"]),
            "—" if r["relative_regret"] is None else f"{100 * r['relative_regret']:+.2f}%",
            f"{100 * r['compute_fraction']:.1f}%",
            g(r["predicted_penalty"]),
            g(r["flagged"]),
            g(r["goal_met"]) if r["parametrization"] == "mup" else "n/a",
            "; ".join(r["warnings"]) or "—",
        ]
        for r in d["rules"]
    ]
    t = md_table(
        [
            "rule",
            "param.",
            "transferred lr",
            "target loss",
            "best direct lr",
            "best direct loss",
            "relative regret",
            "compute (FLOPs) vs direct",
            "predicted penalty",
            "flagged",
            "goal met",
            "diagnostics' warnings",
        ],
        rows,
    )
    goal = [r for r in d["rules"] if r["rule"].startswith("mup") and r["parametrization"] == "mup"]
    met = [r["name"] for r in goal if r["goal_met"]]
    big = [r["name"] for r in d["rules"] if (r["relative_regret"] or 0) > 0.02]
    unflagged = [r["name"] for r in d["rules"] if (r["relative_regret"] or 0) > 0.02 and not r["flagged"]]
    curves = []
    for p, dd in d["direct"].items():
        curves.append(
            f"- {p} direct sweep at width {s['target']}: "
            + ", ".join(f"{c['lr']:g}→{g(c['val_loss'])}" for c in dd["curve"])
            + f" (ladder {dd['ladder_wall_s']:.0f} s vs direct {dd['direct_wall_s']:.0f} s of training wall time)"
        )
    return (
        f"\nLadder {s['ladder']} → target {s['target']} ({s['width_ratio']:.0f}×), {s['steps']} steps × batch {s['batch']} × seq "
        f"{s['seq_len']}, depth {s['depth']}, head_dim {s['head_dim']}, AdamW λ={s['weight_decay']}, seed {s['seed']}; "
        f"LR grids (factor 2): µP {s['grids']['mup'][0]:g}…{s['grids']['mup'][-1]:g}, SP {s['grids']['sp'][0]:g}…{s['grids']['sp'][-1]:g}.\n\n"
        + t
        + "\n\n"
        + _regret_verdict(d)
        + f"Goal (µP regret ≤ 1% at ≥ 8× width for ≤ 10% of the direct sweep's FLOPs), point estimates: **{'met by ' + ', '.join(met) if met else 'missed'}**. "
        + f"Regret above 2%: {', '.join(big) or 'none'}; of those not flagged by the diagnostics: {', '.join(unflagged) or 'none'}.\n\n"
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


SECTIONS = {"transfer_regret": regret_section, "paper_claims": claims_section}
ORDER = ["transfer_regret", "paper_claims"]


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


def main() -> Path:
    from hptransfer.io import write_atomic

    path = write_atomic(ROOT / "BENCHMARKS.md", render())
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
