"""`hpt report STUDY_DIR`: one HTML page a user can open or attach, built from the study folder.

Reads only files the pipeline wrote (pipeline.py's docstring lists them) and writes

  study_dir/report/index.html      the page (no scripts, no external assets)
  study_dir/report/*.png           its figures, referenced by relative path

so the `report/` folder is self-contained: zip it, mail it, or log it to MLflow (done here when a
tracking URI is given: as artifacts `report/` of the study's sweep parent run). A stage that has not
run yet leaves its section saying which command produces it; nothing here trains or sweeps.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import shutil
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

from hptransfer.layout import StudyPaths

_NAMES = StudyPaths(Path("."))  # the study folder's files relative to it, for the "run this to produce it" notes

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em} td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}
th{background:#f4f4f4} td.l,th.l{text-align:left} tr.chosen td{background:#e8f4e8;font-weight:600}
.warn{background:#fff6e0;border-left:4px solid #e0a000;padding:.5em 1em} .ok{background:#eaf6ea;border-left:4px solid #3a3;padding:.5em 1em}
.bad{color:#b00;font-weight:600} .muted{color:#777} img{max-width:100%;border:1px solid #eee}
code{background:#f4f4f4;padding:0 .25em}
"""


def _g(x: Any, fmt: str = ".4g") -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, (int, float)):
        return "—" if isinstance(x, float) and not math.isfinite(x) else format(x, fmt)
    return escape(str(x))


def _e(x: Any) -> str:
    """Any value from a spec, plan, table or JSON file as HTML text: str() then escaped."""
    return escape(str(x))


def _table(header: list[str], rows: list[list[str]], classes: list[str] | None = None, left: int = 1) -> str:
    """Cells are already-escaped HTML; the first `left` columns are left-aligned."""
    th = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>' for i, h in enumerate(header))
    body = []
    for j, r in enumerate(rows):
        cls = f' class="{classes[j]}"' if classes and classes[j] else ""
        body.append(f"<tr{cls}>" + "".join(f'<td class="{"l" if i < left else ""}">{c}</td>' for i, c in enumerate(r)) + "</tr>")
    head = f"<tr>{th}</tr>" if any(header) else ""  # key–value tables need no header row
    return f"<table>{head}{''.join(body)}</table>"


def _missing(what: str, command: str) -> str:
    return f'<p class="muted">{escape(what)} not found — produced by <code>{escape(command)}</code>.</p>'


def _img(name: str, alt: str) -> str:
    return f'<p><img src="{escape(name)}" alt="{escape(alt)}"></p>'


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


# --- sections ------------------------------------------------------------------------------------


def _summary(spec, plan, final: dict | None) -> str:
    rows = [
        ["family / parametrization", f"{_g(spec.model.family)} / {_g(spec.model.parametrization)}"],
        ["depth, head_dim, seq_len", _e(f"{spec.model.depth}, {spec.model.head_dim}, {spec.model.seq_len}")],
        ["width ladder", _g(spec.sweep.widths)],
        [
            "grid"
            if spec.sweep.search == "grid"
            else "Optuna box, trials per width " + "/".join(map(str, spec.sweep.optuna_settings.budgets(len(spec.sweep.widths)))),
            escape("; ".join(f"{k}: " + ", ".join(f"{v:.3g}" for v in vals) for k, vals in spec.sweep.grid.items())),
        ],
        ["fixed", _g(json.dumps(spec.sweep.fixed))],
        ["sweep steps × batch, seeds", _e(f"{spec.sweep.steps} × {spec.sweep.batch_size}, {spec.sweep.seeds}")],
        ["transfer rule", f"<code>{_g(spec.transfer.rule)}</code>"],
        ["target width (× widest swept)", _e(f"{spec.target.width} ({spec.target.width / spec.sweep.widths[-1]:.3g}×)")],
    ]
    out = "<h2>Study</h2>" + _table(["", ""], rows, left=2)
    if plan is None:
        return out + _missing(_NAMES.plan.name, "hpt transfer --study-dir STUDY_DIR")
    hp_rows = [[_e(k), _g(v)] for k, v in plan.hyperparameters.items()]
    out += "<h2>Transferred hyperparameters</h2>" + _table(["hyperparameter", "target value"], hp_rows)
    if plan.param_group_multipliers and plan.model.parametrization == "mup":
        out += (
            '<p class="muted">µP: values are base-width values; per-group factors '
            + escape(json.dumps(plan.param_group_multipliers))
            + "</p>"
        )
    out += _lr_sources(plan)
    d = plan.diagnostics
    res = [["predicted target loss (loss-vs-width fit)", _g(d.predicted_target_loss)]]
    if final:
        res += [
            ["target val loss (measured)", f"<b>{_g(final.get('val_loss'))}</b>"],
            ["target train loss", _g(final.get("train_loss"))],
            ["steps, status", f"{_g(final.get('step'))}, {_g(final.get('status'))}"],
            ["wall time (s)", _g(final.get("wall_s"), ".0f")],
        ]
    if d.predicted_target_loss_interval:
        lo, hi = d.predicted_target_loss_interval
        res.insert(1, ["predicted interval (95%)", f"{_g(lo)} – {_g(hi)}"])
    out += "<h2>Target run</h2>" + _table(["", ""], res, left=1)
    if final:
        from hptransfer.transfer.target_check import check_target

        check = check_target(d, final.get("val_loss"))
        cls = "ok" if check["verdict"] in ("ok", "unchecked") else "warn"
        out += f'<div class="{cls}"><b>{_e(check["verdict"])}</b>: ' + "; ".join(_e(m) for m in check["messages"]) + "</div>"
    if not final:
        out += _missing(str(_NAMES.train.metrics), f"hpt train STUDY_DIR/{_NAMES.plan.name}")
    return out


def _lr_sources(plan) -> str:
    """The plan's LR beside the ladder's alone and the free formulas', as the hidden matrices' LR at the
    target (what the formulas are about), with each one's error in log η where it has one."""
    b, fp = plan.baselines or {}, (plan.baselines or {}).get("formula_prior")
    if not b.get("step_law"):
        return ""
    hidden = b["step_law"]["lr"] * b["step_law"]["plan_lr_ratio"]  # the plan's hidden-matrix lr, as the engine priced it
    rows = [["plan", _g(hidden), _g(fp.get("posterior_log_sd"), ".2g") if fp else "—"]]
    if fp:
        rows.append(["ladder alone", _g(fp["ladder_hidden_lr"]), _g(fp.get("ladder_log_sd"), ".2g")])
    for name in ("step_law", "deepseek"):
        if name in b:
            sd = fp["formula_log_sd"] if fp and fp["formula"] == name else None
            rows.append([name, _g(b[name]["lr"]), _g(sd, ".2g") if sd else "—"])
    note = (
        f'<p class="muted">{_e(fp["said"])} (transfer/formula_prior.py)</p>'
        if fp
        else '<p class="muted">the formulas are shown only (transfer.formula_prior: null, or not a llama plan)</p>'
    )
    return (
        "<h2>LR: plan, ladder and formulas</h2>" + _table(["source", "hidden-matrix lr at the target", "σ (log η)"], rows) + note
    )


def _warnings(plan) -> str:
    if plan is None:
        return ""
    warns, notes = plan.diagnostics.warnings, plan.diagnostics.notes
    box = (
        '<div class="warn"><b>Warnings</b><ul>' + "".join(f"<li>{_e(w)}</li>" for w in warns) + "</ul></div>"
        if warns
        else '<div class="ok">No warnings: optima interior and convex, no drift flagged.</div>'
    )
    return (
        "<h2>Warnings</h2>" + box + ("<ul>" + "".join(f"<li class=muted>{_e(n)}</li>" for n in notes) + "</ul>" if notes else "")
    )


def _diagnostics(plan) -> str:
    if plan is None:
        return ""
    d = plan.diagnostics
    hp = d.primary
    hp_html = _e(hp)  # from the plan file: escaped wherever it goes into a cell
    rows = []
    for w, per in d.optimum_by_width.items():
        f = per.get(hp)  # typed (plan_diagnostics); getattr(None, ...) reads a missing one as empty
        flags = [
            s
            for s, on in (
                ("grid edge", getattr(f, "on_edge", None)),
                ("not convex", getattr(f, "convex", None) is False),
                ("capped by divergence", getattr(f, "capped_by_divergence", None)),
            )
            if on
        ]
        trials = ", ".join(f"{k} {v}" for k, v in d.trials_by_width.get(w, {}).items())
        rows.append(
            [
                _g(w),
                _g(getattr(f, "value", None)),
                _g(getattr(f, "best_grid_value", None)),
                _g(getattr(f, "best_loss", None)),
                _ci(getattr(f, "ci", None)),
                _g(getattr(f, "curvature", None)),
                escape(trials),
                f'<span class="bad">{escape("; ".join(flags))}</span>' if flags else "",
            ]
        )
    out = "<h3>Optimum by width</h3>" + _table(
        ["width", f"{hp}* (fit)", "best grid", "best loss", "CI", "curvature κ", "trials", "flags"], rows
    )
    drift, lf, trend = d.drift_fit, d.loss_fit, d.optimum_trend.get(hp)
    fast = d.fast_transfer
    kv = [
        ["fast transfer (paper 2: β > α/2)", "undecided" if fast is None else _g(fast)],
        ["test", _g(d.fast_transfer_test or d.fast_transfer_undecided)],
        [
            f"trend d log {hp_html}*/d log n",
            f"{_g(getattr(trend, 'slope', None))} ± {_g(getattr(trend, 'slope_se', None))}",
        ],
        [
            "drift law log ν* = x∞ + K·n^−β",
            f"{_g(getattr(drift, 'drift', None))}; B={_g(getattr(drift, 'B', None))}, "
            f"β={_g(getattr(drift, 'beta', None))}, ν*(∞)={_g(getattr(drift, 'value_at_infinity', None))}",
        ],
        ["loss law φ* = φ∞ + A·n^−α", f"φ∞={_g(lf.phi_inf)}, A={_g(lf.A)}, α={_g(lf.alpha)}" if lf else "—"],
        ["curvature κ at the widest width", _g(d.curvature)],
        [f"trend {hp_html}* at the target width", _g(d.trend_value_at_target)],
        ["predicted penalty of the plan (loss)", _g(d.predicted_penalty)],
        ["source width", _g(d.source_width)],
    ]
    return "<h3>Transfer diagnostics</h3>" + _table(["", ""], kv, left=1) + out


def _ci(ci) -> str:
    """A CI whose open side (a censored optimum: a bound, not a point) is null prints as ∞ / 0."""
    if not ci:
        return "—"
    lo, hi = ci
    return f"[{'0' if lo is None else format(lo, '.3g')}, {'∞' if hi is None else format(hi, '.3g')}]"


def _coord(paths: StudyPaths) -> str:
    data = _read_json(paths.coord_check_json)
    png = paths.coord_check_png
    html = "<h2>Coordinate check</h2>"
    if png.is_file():
        shutil.copyfile(png, paths.report_dir / png.name)
        html += _img(png.name, "coordinate check: activation size against width")
    if data is None:
        return html + _missing(paths.coord_check_json.name, "hpt coord-check SPEC")
    verdict = "ok" if data.get("passed") else "warn"
    html += (
        f'<div class="{verdict}">{"passed" if data.get("passed") else "FAILED"}: the steepest growth of '
        f"log|activation| with log width is {_g(data.get('worst_slope'), '.3f')} "
        f"({_e(data.get('worst_module'))}), allowed {_g(data.get('max_slope_allowed'))}; widths "
        f"{_e(data.get('widths'))}, {_e(data.get('steps'))} Adam steps.</div>"
    )
    return html


def _dp(spec) -> str:
    if spec.dp is None:
        return ""
    from hptransfer.dp.plan import DPPlanError, dp_plan_for

    c = spec.dp
    head = f"<h2>DP noise (ε={c.epsilon:g}, δ={c.delta:g}, E={c.epochs:g}, accountant {_e(c.accountant)})</h2>"
    if c.dataset_size is None:
        return (
            head
            + '<p class="muted">dp.dataset_size is not set (it is derived from the task when the plan is made); run <code>hpt dp-plan</code>.</p>'
        )
    try:
        p = dp_plan_for(c)
    except DPPlanError as e:
        return head + f'<div class="warn">{escape(str(e))}</div>'
    rows, classes = [], []
    for r in p.table:
        rows.append(
            [
                _g(r.batch_size),
                _g(r.steps),
                _g(r.sigma),
                _g(r.sigma_sqrt_t, ".4g"),
                _g(r.sigma_over_b, ".3g"),
                "yes" if r.feasible else escape(r.reason or "no"),
            ]
        )
        classes.append("chosen" if r.batch_size == p.batch_size else "")
    return (
        head + f"<p>Chosen B = <b>{p.batch_size}</b> (T = {p.steps}, σ = {p.noise_multiplier:.4g}): the smallest "
        f"feasible B whose cumulative noise σ√T is within {c.tolerance:.0%} of the minimum (paper 1, arXiv 2510.20616). "
        f"Clipping grid: {escape(', '.join(f'{x:.3g}' for x in p.clip_grid))}.</p>"
        + _table(["B", "T", "σ", "σ√T", "σ/B", "feasible"], rows, classes)
        + "".join(f'<p class="muted">{escape(n)}</p>' for n in p.notes)
    )


# --- entry point ---------------------------------------------------------------------------------


def write_report(study_dir: str | Path, tracking_uri: str | None = None, log: Callable[[str], None] = print) -> Path:
    """Write study_dir/report/index.html and its PNGs; log the folder to the study's MLflow sweep
    parent run when `tracking_uri` is given. Returns the path of index.html."""

    from hptransfer.io import write_atomic
    from hptransfer.plan import load_plan
    from hptransfer.report.figures import plot_axes, plot_optimum, plot_transfer
    from hptransfer.spec import load_spec
    from hptransfer.transfer.engine import read_results

    study = Path(study_dir).resolve()
    paths = StudyPaths(study)
    spec = load_spec(paths.spec)  # a clear SpecError when the folder is not a study
    out = paths.report_dir
    out.mkdir(parents=True, exist_ok=True)
    plan = load_plan(paths.plan) if paths.plan.is_file() else None
    metrics = _read_json(paths.train.metrics)
    final = (metrics or {}).get("final")
    results = paths.sweep_results

    parts = [
        f"<h1>hptransfer report — {escape(spec.name)}</h1>",
        f'<p class="muted">{escape(str(study))} · generated {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M UTC}</p>',
        _summary(spec, plan, final),
        _warnings(plan),
        "<h2>µTransfer plot</h2>",
    ]
    if results.is_file():
        df = read_results(results)  # the one reader: identifiers stay text
        target_loss = final.get("val_loss") if final else None
        plot_transfer(df, spec, plan, target_loss, paths.report_transfer_png)
        parts.append(
            _img(paths.report_transfer_png.name, "validation loss against learning rate per width, with the transferred point")
        )
        parts.append(
            '<p class="muted">★ best grid point per width; ◆ the transferred value'
            + (" at the target run's validation loss" if target_loss is not None else "")
            + ".</p>"
        )
    else:
        parts.append(_missing(paths.sweep_results.name, "hpt sweep SPEC"))
    parts.append("<h2>Optimum against width</h2>")
    if plan is not None and plot_optimum(plan, paths.report_optimum_png) is not None:
        parts.append(_img(paths.report_optimum_png.name, "optimal learning rate against width with its fits"))
    if plan is not None and plot_axes(plan, out / AXES_PNG) is not None:
        parts.append("<h2>Optimum against steps, batch size and depth</h2>")
        parts.append(_img(AXES_PNG, "optimal learning rate against each swept axis with its law and the target"))
        parts.append(_axes_table(plan))
    parts.append(_diagnostics(plan) or _missing(paths.plan.name, "hpt transfer --study-dir STUDY_DIR"))
    parts.append(_coord(paths))
    parts.append(_dp(spec))
    page = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>hpt report: {escape(spec.name)}</title>'
        f"<style>{_CSS}</style></head><body>{''.join(parts)}</body></html>\n"
    )
    index = write_atomic(paths.report_html, page)
    if tracking_uri:
        from types import SimpleNamespace

        from hptransfer.tracking import mlflow_or_later

        where = SimpleNamespace(tracking_uri=tracking_uri, root=study)
        mlflow_or_later(where, "the report", lambda: _log_to_mlflow(spec, study, out, tracking_uri, log), log)
    return index


AXES_PNG = "axes.png"


def _axes_table(plan) -> str:
    """Each axis's law: verdict, exponent and interval, the move to the target, the baselines'."""
    rows = []
    for axis, law in (plan.axes or {}).get("laws", {}).items():
        bl = law.get("baselines", {})
        rows.append(
            [
                _e(axis),
                _e(law["verdict"]),
                _g(law["exponent"], "+.3g") + (" " + _ci(law.get("exponent_ci")) if law.get("exponent_ci") else ""),
                f"{law['base']} → {law['target']}",
                "×" + _g(law["factor"], ".3g"),
                " · ".join(f"{_e(k)} ×{_g(v['factor'], '.3g')}" for k, v in bl.items()),
                _e(law.get("reason", "")),
            ]
        )
    cb = (plan.axes or {}).get("critical_batch")
    note = (
        f'<p class="muted">critical batch B_simple ≈ {_g(cb["b_simple"], ".3g")} sequences '
        f"(range {_g(cb['range'][0], '.3g')}–{_g(cb['range'][1], '.3g')}, {cb['n_trials']} trials)</p>"
        if cb
        else ""
    )
    return _table(["axis", "verdict", "exponent (95%)", "ladder → target", "lr factor", "baselines' factor", "why"], rows) + note


def _log_to_mlflow(spec, study: Path, out: Path, tracking_uri: str, log: Callable[[str], None]) -> str | None:
    from hptransfer.context import StudyContext
    from hptransfer.tracking import find_study_run

    st = StudyContext.from_spec(spec, study, tracking_uri=tracking_uri)
    run_id = find_study_run(st.tracking_uri, st.experiment, st.root, "sweep")
    if run_id is None:
        log(
            f"report not logged to MLflow: no sweep run tagged hpt.study_dir={study} in experiment {st.experiment!r} "
            f"at {tracking_uri} (run `hpt sweep` with this tracking URI first)"
        )
        return None
    st.tracker(run_id=run_id).log_artifact(out, out.name)
    return run_id
