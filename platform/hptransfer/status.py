"""`hpt status STUDY_DIR`: where a study stands, read from its folder alone (no Ray is started).

Per stage: its state, a one-line summary and its files. A stage is `done` when its file is there;
`running` when a process holds the study's lock and the stage is not done yet (or, for the large run,
`progress.json` says so); `interrupted` when its partial state is there and nobody holds the lock.

- spec: `spec.yaml`; coordinate check: `coord_check.json` (pass / fail, worst slope).
- sweep: trial counts by status from `sweep_results.csv`; while it runs (or after a crash), from
  the latest Ray Tune `experiment_state-*.json` and the `trials_done/` markers (a marker is written
  the moment a trial ends; Tune's snapshot may be up to ~10 s older).
- plan: `transfer_plan.yaml`; large run: `train/progress.json` (step, total, tokens/s, ETA, when)
  and `train/train_metrics.json` (final metrics); report: `report/index.html`.
- MLflow: the tracking URI and experiment this study resolves to, and its runs (tag
  `hpt.study_dir`), read with short timeouts so a server that is down cannot stall the command;
  what an outage left unlogged (`train/mlflow_unsent.jsonl`) and the command that delivers it.
- Torn files: `sweep_results.csv` or `transfer_plan.yaml` cut short while written (`io.torn`) show
  as `torn`, with the command that rewrites them.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from hptransfer.errors import StudyError
from hptransfer.io import torn
from hptransfer.layout import DP_SWEEP_EXPERIMENT, SWEEP_EXPERIMENT, StudyPaths, resolve_tracking_uri
from hptransfer.lock import live_holder
from hptransfer.train.progress import duration

DONE, RUNNING, INTERRUPTED, MISSING = "done", "running", "interrupted", "not run"


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _yaml(path: Path) -> dict | None:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def _rel(paths: StudyPaths, *files: Path) -> list[str]:
    return [str(f.relative_to(paths.root)) for f in files if f.exists()]


def _stage(state: str, summary: str = "", files: list[str] | None = None, **details: Any) -> dict:
    return {"state": state, "summary": summary, "files": files or [], **details}


def _coord_check(paths: StudyPaths) -> dict:
    cc = _json(paths.coord_check_json)
    if cc is None:
        return _stage(MISSING)
    passed = bool(cc.get("passed"))
    return _stage(
        "pass" if passed else "fail",
        f"worst slope {cc.get('worst_slope', float('nan')):.2f} ({cc.get('worst_module')}) vs allowed "
        f"{cc.get('max_slope_allowed')}, widths {cc.get('widths')}",
        _rel(paths, paths.coord_check_png, paths.coord_check_json),
        passed=passed,
    )


def _tune_counts(exp_dir: Path) -> Counter:
    """Trials by Ray Tune status in the experiment's latest state snapshot."""
    states = sorted(exp_dir.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    data = _json(states[-1]) if states else None
    counts: Counter = Counter()
    for entry in (data or {}).get("trial_data", []):
        try:
            counts[json.loads(entry[0]).get("status", "UNKNOWN")] += 1
        except (ValueError, TypeError, IndexError, AttributeError):
            counts["UNKNOWN"] += 1
    return counts


def _sweep(paths: StudyPaths, experiment: str, results: Path, total: int | None, busy: bool, markers: Path | None) -> dict:
    exp_dir = paths.experiment_dir(experiment)
    if results.exists() and not (busy and exp_dir.exists() and _newest(exp_dir) > results.stat().st_mtime):
        with results.open(newline="") as f:
            counts = Counter(row.get("status", "?") for row in csv.DictReader(f))
        n = sum(counts.values())
        return _stage(
            DONE,
            f"{n} trials: " + ", ".join(f"{v} {k}" for k, v in counts.most_common()),
            _rel(paths, results, results.with_suffix(".png")),
            trials=n,
            by_status=dict(counts),
        )
    if not exp_dir.exists():
        return _stage(MISSING)
    tune = _tune_counts(exp_dir)
    finished = max(
        tune.get("TERMINATED", 0) + tune.get("ERROR", 0), len(list(markers.glob("*.json"))) if markers and markers.is_dir() else 0
    )
    of = f"/{total}" if total else ""
    summary = f"{finished}{of} trials finished; Tune: " + (
        ", ".join(f"{v} {k.lower()}" for k, v in tune.most_common()) or "no state snapshot yet"
    )
    return _stage(
        RUNNING if busy else INTERRUPTED,
        summary + ("" if busy else "; rerun the sweep to resume it"),
        _rel(paths, exp_dir),
        finished=finished,
        total=total,
        tune_status=dict(tune),
    )


def _newest(folder: Path) -> float:
    return max((p.stat().st_mtime for p in folder.glob("experiment_state-*.json")), default=0.0)


def _plan(paths: StudyPaths) -> dict:
    plan = _yaml(paths.plan)
    if plan is None:
        return _stage(MISSING)
    hps = plan.get("hyperparameters") or {}
    target = plan.get("target") or {}
    return _stage(
        DONE,
        f"rule {plan.get('rule')}: width {target.get('width')}, {target.get('steps')} steps, "
        + ", ".join(f"{k}={v:.4g}" for k, v in hps.items() if isinstance(v, (int, float))),
        _rel(paths, paths.plan),
        rule=plan.get("rule"),
        target=target,
        hyperparameters=hps,
    )


def _train(paths: StudyPaths, busy: bool) -> dict:
    tp = paths.train
    files = _rel(paths, tp.metrics, tp.progress, tp.hf_model, tp.ray_experiment)
    final = (_json(tp.metrics) or {}).get("final")
    progress = _json(tp.progress)
    if final and not (progress and progress.get("status") == RUNNING and busy):
        keys = ("step", "train_loss", "val_loss", "tokens_per_s", "wall_s", "status")
        metrics = {k: final.get(k) for k in keys if final.get(k) is not None}
        return _stage(
            DONE if final.get("status") == "ok" else str(final.get("status")),
            ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()),
            files,
            final=metrics,
        )
    if not progress:
        return _stage(
            RUNNING if busy and tp.root.exists() else MISSING,
            "starting (no step yet)" if busy and tp.root.exists() else "",
            files,
        )
    age = time.time() - float(progress.get("time", 0))
    eta = max(0.0, float(progress.get("eta_s") or 0) - age)
    state = RUNNING if busy else INTERRUPTED
    step, total = progress.get("step"), progress.get("total")
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    if progress.get("train_loss") is not None:
        parts.append(f"loss {progress['train_loss']:.4f}")
    if progress.get("val_loss") is not None:
        parts.append(f"val {progress['val_loss']:.4f} (step {progress.get('val_step')})")
    if progress.get("tokens_per_s") is not None:
        parts.append(f"{progress['tokens_per_s']:.0f} tok/s")
    if state == RUNNING:
        parts.append(f"ETA {duration(eta)}")
    parts.append(f"updated {duration(age)} ago")
    if progress.get("checkpoint_step"):
        parts.append(f"checkpoint at step {progress['checkpoint_step']}")
    if state == INTERRUPTED and progress.get("status") == "preempted":
        state = "preempted"  # stopped on SIGTERM after a checkpoint
    if state != RUNNING:
        parts.append("`hpt run` or `hpt train PLAN --resume` continues it")
    return _stage(state, ", ".join(parts), files, progress={**progress, "eta_now_s": round(eta, 1), "age_s": round(age, 1)})


def _mlflow(paths: StudyPaths, uri: str, experiment: str) -> dict:
    out: dict[str, Any] = {"tracking_uri": uri, "experiment": experiment, "runs": []}
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        out["note"] = "no MLflow database yet"
        return out
    # A tracking server that is down must not stall a status command for minutes of retries.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    try:
        from mlflow import MlflowClient

        from hptransfer.tracking import TAG_KIND, TAG_STUDY

        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            out["note"] = f"no experiment {experiment!r} yet"
            return out
        out["experiment_id"] = exp.experiment_id
        runs = client.search_runs(
            [exp.experiment_id],
            filter_string=f"tags.`{TAG_STUDY}` = '{paths.root}'",
            max_results=5000,
            order_by=["attributes.start_time ASC"],
        )
        out["runs_by_kind"] = dict(Counter(r.data.tags.get(TAG_KIND, "?") for r in runs))
        out["runs"] = [
            {"kind": r.data.tags.get(TAG_KIND, "?"), "run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status}
            for r in runs
            if r.data.tags.get(TAG_KIND) != "trial"
        ]
    except Exception as e:  # status is a read-only look: report, never fail on the tracker
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return out


def _privacy(paths: StudyPaths, ledger: dict) -> dict:
    """The fine-tuning study's privacy ledger (dp/ledger.py): the whole study's ε, not the last run's."""
    try:
        t, entries = ledger["total"], ledger["entries"]
        summary = (
            f"ε total {t['epsilon']:.4g} (δ {t['delta']:.3g}) of budget {ledger['budget_epsilon']:g}: "
            f"{len(entries)} read(s) of private data ({', '.join(e['stage'] for e in entries)}); tuning {ledger['tuning']}"
        )
    except (KeyError, TypeError) as e:
        return _stage("torn", f"{paths.privacy_ledger.name} lacks {e}", _rel(paths, paths.privacy_ledger))
    return _stage(DONE, summary, _rel(paths, paths.privacy_ledger), epsilon_total=t["epsilon"], delta_total=t["delta"])


def study_status(study_dir: str | Path, *, tracking_uri: str | None = None, mlflow: bool = True) -> dict:
    paths = StudyPaths(Path(study_dir).resolve())
    if not paths.root.is_dir():
        raise StudyError(f"{study_dir} is not a folder; pass a study folder (`hpt run` prints it; default studies/<name>)")
    spec = _yaml(paths.spec)
    holder = live_holder(paths.lock)  # None when nobody holds it, or its holder died (a stale lock)
    busy = holder is not None
    total = None
    if spec is not None:
        try:
            from hptransfer.spec import parse_spec

            total = parse_spec(spec).sweep.n_trials
        except Exception:  # a hand-edited spec: show what is there anyway
            total = None
    plan = _yaml(paths.plan) or {}
    name = (spec or {}).get("name") or plan.get("study") or paths.root.name
    stages = {
        "spec": _stage(DONE, f"study {name!r}", _rel(paths, paths.spec)) if spec is not None else _stage(MISSING),
        "coord_check": _coord_check(paths),
        "sweep": _sweep(paths, SWEEP_EXPERIMENT, paths.sweep_results, total, busy, paths.trials_done),
    }
    if paths.dp_sweep_results.exists() or paths.experiment_dir(DP_SWEEP_EXPERIMENT).exists():
        stages["dp_sweep"] = _sweep(paths, DP_SWEEP_EXPERIMENT, paths.dp_sweep_results, None, busy, None)
    stages["plan"] = _plan(paths)
    stages["train"] = _train(paths, busy)
    stages["report"] = _stage(DONE, "", _rel(paths, paths.report_html)) if paths.report_html.exists() else _stage(MISSING)
    if (ledger := _json(paths.privacy_ledger)) is not None:
        stages["privacy"] = _privacy(paths, ledger)
    for key, path, fix in (
        (
            "sweep",
            paths.sweep_results,
            "rerun the sweep (`hpt sweep` or `hpt run`): it rewrites the table, training nothing again",
        ),
        ("plan", paths.plan, "`hpt transfer --study-dir DIR` (or `hpt run`) makes it again"),
    ):
        if why := torn(path):
            stages[key] = _stage("torn", f"{path.name} was cut short while written ({why}); {fix}", _rel(paths, path))
    order = ["spec", "coord_check", "sweep", "plan", "train", "report"]
    reached = [i for i, key in enumerate(order) if stages[key]["state"] != MISSING]
    if busy and reached and stages[order[reached[-1]]]["state"] != RUNNING and reached[-1] + 1 < len(order):
        stages[order[reached[-1] + 1]]["state"] = RUNNING  # the lock holder works on the stage after the last one there
    tracking = (spec or {}).get("tracking") or {}
    uri = resolve_tracking_uri(paths.root, tracking.get("uri"), tracking_uri)
    experiment = tracking.get("experiment") or name
    return {
        "study": name,
        "study_dir": str(paths.root),
        "running": holder,
        "stages": stages,
        "log_file": str(paths.log_file) if paths.log_file.exists() else None,
        "mlflow": {
            **(_mlflow(paths, uri, experiment) if mlflow else {"tracking_uri": uri, "experiment": experiment}),
            **_unsent(paths),
        },
    }


def _unsent(paths: StudyPaths) -> dict:
    """What MLflow did not take while it was down (tracking.Spooled), and how to deliver it."""
    from hptransfer.tracking import describe_unsent, read_unsent

    ops = read_unsent(paths.train.mlflow_unsent)
    if not ops:
        return {}
    return {
        "unsent": f"{describe_unsent(ops)} in {paths.train.mlflow_unsent.relative_to(paths.root)}",
        "replay": f"hpt status {paths.root} --replay-mlflow",
    }


def replay_mlflow(study_dir: str | Path, *, tracking_uri: str | None = None) -> str:
    """Deliver what an MLflow outage left unsent; a line saying what was delivered or what still waits."""
    from hptransfer.tracking import describe_unsent, read_unsent, replay_unsent

    paths = StudyPaths(Path(study_dir).resolve())
    spool = paths.train.mlflow_unsent
    ops = read_unsent(spool)
    if not ops:
        return "MLflow: nothing left unsent"
    spec = _yaml(paths.spec) or {}
    uri = resolve_tracking_uri(paths.root, ((spec.get("tracking") or {}).get("uri")), tracking_uri)
    # Where the run was made, unless told otherwise: the large run records its tracking URI.
    recorded = _json(paths.train.mlflow_run) or {}
    uri = tracking_uri or recorded.get("tracking_uri") or uri
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    if replay_unsent(spool, uri):
        return f"MLflow: delivered {describe_unsent(ops)} to {uri}"
    return f"MLflow: {uri} is still unreachable; waiting: {describe_unsent(read_unsent(spool))}"


LABELS = {
    "spec": "spec",
    "coord_check": "coord check",
    "sweep": "sweep",
    "dp_sweep": "DP sweep",
    "plan": "plan",
    "train": "large run",
    "report": "report",
    "privacy": "privacy",
}


def describe(status: dict) -> list[str]:
    """The status as plain lines (no markup, no colour) for a terminal or a CI log."""
    lines = [f"study {status['study']}  {status['study_dir']}"]
    holder = status.get("running")
    if holder:
        lines.append(
            f"  in use by pid {holder.get('pid')} on {holder.get('host')} since {holder.get('started')} "
            f"({holder.get('command', '?')})"
        )
    for key, st in status["stages"].items():
        files = "  [" + ", ".join(st["files"]) + "]" if st["files"] else ""
        lines.append(f"  {LABELS.get(key, key):<12} {st['state']:<12} {st['summary']}{files}".rstrip())
    if status.get("log_file"):
        lines.append(f"  log file     {status['log_file']}")
    m = status["mlflow"]
    lines.append(
        f"MLflow {m['tracking_uri']}  experiment {m['experiment']!r}"
        + (f" (id {m['experiment_id']})" if m.get("experiment_id") else "")
    )
    for note in ("note", "error"):
        if m.get(note):
            lines.append(f"  {note}: {m[note]}")
    if m.get("runs_by_kind"):
        lines.append("  runs: " + ", ".join(f"{v} {k}" for k, v in m["runs_by_kind"].items()))
    for r in m.get("runs", []):
        lines.append(f"  {r['kind']:<9} {r['run_id']}  {r['status']:<9} {r['name']}")
    if m.get("unsent"):
        lines.append(f"  NOT LOGGED (MLflow was unreachable): {m['unsent']}; deliver it: {m['replay']}")
    return lines
