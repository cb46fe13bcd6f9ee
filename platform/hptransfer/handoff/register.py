"""`hpt handoff --register NAME`: the hand-off folder as a version of an MLflow registered model.

A version is registered only once the folder has been checked as its consumer would check it: the
stand-alone loop in `consumer.py` (plain torch + transformers, run as its own `python -I` process,
no hptransfer) trains `model/` with `optimizer.json` on `conformance/batches.pt`, and its losses
must match `conformance/losses.json` within CONFORMANCE_TOL at every step (the hand-off README's
claim). A folder that fails the check is not registered: the registry then only holds folders a
trainer is known to reproduce.

What MLflow gets: a run `<study>-handoff` (kind `handoff`, a child of the study's sweep run when the
store has one) with the folder under `handoff/` and the plan file, the metric
`conformance_max_rel_error`, and a model version whose source is that artifact folder, tagged with
the plan's sha256, rule, target and the measured error, so the registry UI says what to train and
how it was checked. Loading it back needs only MLflow: `mlflow.artifacts.download_artifacts(
"models:/NAME/V")` gives the folder.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hptransfer.errors import PlanError, Problem

CONFORMANCE_TOL = 1e-4  # max relative error per step; the README of the hand-off promises it
CONSUMER = Path(__file__).with_name("consumer.py")
CONSUMER_TIMEOUT_S = 900


@dataclass(frozen=True)
class Registered:
    name: str
    version: str
    run_id: str
    max_rel_error: float
    plan_sha256: str


def max_rel_error(got: list[float], want: list[float]) -> float:
    """max_i |got_i − want_i| / |want_i|; inf when the lengths differ (a trainer that stopped early)."""
    if len(got) != len(want) or not want:
        return float("inf")
    return max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want))


def consumer_losses(folder: Path, timeout_s: float = CONSUMER_TIMEOUT_S) -> list[float]:
    """The consumer's losses on `folder`, from its own process (isolated: `-I`, no hptransfer on its path)."""
    proc = subprocess.run([sys.executable, "-I", str(CONSUMER), str(folder)], capture_output=True, text=True, timeout=timeout_s)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise PlanError(
            str(folder),
            [
                Problem(
                    "--register",
                    "the stand-alone consumer (plain torch + transformers) could not train this hand-off, so it is "
                    f"not registered; its last output: {(proc.stderr or proc.stdout)[-1500:]}",
                )
            ],
        )
    return [float(x) for x in json.loads(lines[-1])["losses"]]


def check_conformance(folder: Path) -> float:
    """The consumer's max relative error against the folder's own losses.json; refuses above the tolerance."""
    from hptransfer.handoff.write import CONFORMANCE_DIR, LOSSES_FILE

    want = json.loads((folder / CONFORMANCE_DIR / LOSSES_FILE).read_text())["train_loss"]
    err = max_rel_error(consumer_losses(folder), want)
    if not err <= CONFORMANCE_TOL:
        raise PlanError(
            str(folder),
            [
                Problem(
                    "--register",
                    f"a plain torch + transformers loop on this folder misses {CONFORMANCE_DIR}/{LOSSES_FILE} by up to "
                    f"{err:.3g} (relative) where the hand-off promises {CONFORMANCE_TOL:g} at every step; not registered",
                    fix="rewrite the hand-off with `hpt handoff PLAN --out DIR --force`; if it fails again, report it",
                )
            ],
        )
    return err


def register_handoff(folder: str | Path, plan_path: str | Path, name: str, *, tracking_uri: str | None = None) -> Registered:
    """Check `folder` (written by write_handoff for `plan_path`), log it and register it as a version of `name`."""
    from mlflow.exceptions import MlflowException

    from hptransfer.context import StudyContext
    from hptransfer.plan import load_plan
    from hptransfer.tracking import find_study_run

    folder, plan_path = Path(folder).resolve(), Path(plan_path).resolve()
    err = check_conformance(folder)
    plan = load_plan(plan_path)
    sha = hashlib.sha256(plan_path.read_bytes()).hexdigest()
    ctx = StudyContext.for_plan(plan_path, tracking_uri=tracking_uri)
    tags = {
        "hpt.plan_sha256": sha,
        "hpt.rule": plan.rule,
        "hpt.study": plan.study,
        "hpt.target_width": plan.target.width,
        "hpt.target_steps": plan.target.steps,
        "hpt.target_batch_size": plan.target.batch_size,
        "hpt.conformance_max_rel_error": f"{err:.3g}",
        "hpt.conformance_tol": f"{CONFORMANCE_TOL:g}",
    }
    parent = find_study_run(ctx.tracking_uri, ctx.experiment, ctx.root, "sweep")
    tracker = ctx.tracker(f"{plan.study}-handoff", kind="handoff", parent_run_id=parent, tags=tags)
    try:
        tracker.log_artifact(folder, "handoff")
        tracker.log_artifact(plan_path, "plan")
        tracker.log_metrics({"conformance_max_rel_error": err})
        c = tracker.client
        try:
            c.create_registered_model(
                name, description=f"hptransfer hand-offs of study {plan.study}: the target at step 0, to train."
            )
        except MlflowException as e:
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        source = f"{c.get_run(tracker.run_id).info.artifact_uri}/handoff"
        mv = c.create_model_version(
            name,
            source=source,
            run_id=tracker.run_id,
            tags={k: str(v) for k, v in tags.items()},
            description=f"rule {plan.rule}, width {plan.target.width}, {plan.target.steps} steps; "
            f"consumer loop matches losses.json to {err:.2g}",
        )
    except BaseException:
        tracker.end("FAILED")
        raise
    tracker.end()
    return Registered(name, str(mv.version), tracker.run_id, err, sha)
