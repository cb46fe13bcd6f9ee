"""`hpt train PLAN`: the large run's one driver, for a plain plan and a `dp` plan alike. A Ray Train
TorchTrainer (gloo on CPU, NCCL on GPU) runs the one worker loop (`train/loop.py`) with the plan's
recipe (`train/recipe.py`): `train/plain.py` (DeepSpeed), or `train/private.py` (Opacus) for `dp`.

Reads top to bottom: the recipe's launch (its checks run before anything is written) → the train/
folder (restart, resume, refusal) → the study's MLflow run of this large run (a resume logs into the
same one: train/mlflow_run.json) with the plan's parameters → the plan (and the recipe's files)
saved beside the run → Ray Train, SIGTERM asking the workers to stop → artifacts, final metrics and
the run's status (a stopped run: KILLED, and `TrainingPreempted`, exit 75).

Faults and what they leave (README "Failures and resume"): a worker dies → Ray Train restarts the
group from the newest whole checkpoint (`train.max_failures`); SIGTERM → stop at the next step
boundary, a checkpoint, exit 75, `--resume` (or the same `hpt run`) continues; the driver killed →
the same; MLflow down → what it did not take waits in train/mlflow_unsent.jsonl
(`hpt status` says what; `hpt status --replay-mlflow` delivers it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hptransfer import logs
from hptransfer.errors import PlanError, Stopped
from hptransfer.io import write_json
from hptransfer.layout import TRAIN_EXPERIMENT
from hptransfer.plan import TransferPlan, save_plan
from hptransfer.train.recipe import Launch

if TYPE_CHECKING:
    from hptransfer.context import StudyContext

FINAL_METRICS = ("train_loss", "val_loss", "initial_val_loss", "tokens_per_s", "epsilon_spent")  # logged as final_<name>


class TrainingPreempted(Stopped):
    """The driver got SIGTERM: the workers stopped at a step boundary after a checkpoint; the same
    command with --resume (or the same `hpt run`) continues. Exit status 75 (errors.EXIT_RETRYABLE)."""


class TrainingStopped(Stopped, RuntimeError):
    """The large run stopped before its end (a worker failed more often than `train.max_failures`
    allows, or the cluster lost the room for its workers); its latest checkpoint is kept, and
    `--resume` continues from it. The CLI prints the line and exits 75: a resubmitted job resumes."""


def launch_for(plan: TransferPlan, *, dp_seed: int | None = None) -> Launch:
    """The plan's recipe on the driver: the private run for a `dp` plan, else the plain one."""
    from hptransfer.train import plain, private

    return private.launch(plan, dp_seed=dp_seed) if plan.rule == "dp" else plain.launch(plan)


def run_train(
    ctx: StudyContext,
    plan: TransferPlan,
    *,
    resume: bool = False,
    restart: bool = False,
    log=print,
    mlflow_every: int | None = None,
    dp_seed: int | None = None,
) -> dict:
    """Run (or, with resume=True, continue from its latest checkpoint) the large run of `plan` into
    the study's train/ folder, privately for a `dp` plan; returns rank 0's final metrics (a private
    run's carry `epsilon_spent` and `delta`). Rank 0's progress lines are printed
    (`hptransfer.logs.progress`) as they come; MLflow gets every step's metrics, written at most
    every 10 s of training (every `mlflow_every` steps if set). `dp_seed` fixes a private run's
    sampling and noise (research runs only: the default is drawn secretly)."""
    from hptransfer.train.loop import train_loop_per_worker

    paths = ctx.paths.train
    launch = launch_for(plan, dp_seed=dp_seed)  # a bad plan fails here, before anything is written
    if prepare_train_dir(ctx, plan, resume=resume, restart=restart, log=log) and launch.check_resume:
        launch.check_resume(paths.plan)
    paths.stop_request.unlink(missing_ok=True)  # a stop asked of an earlier run is not this one's
    tracker = train_tracker(
        ctx,
        plan,
        tags={"rule": plan.rule, **launch.tags},
        params={**run_params(plan), **launch.params, **{f"hp.{k}": v for k, v in plan.hps.as_dict().items()}},
        log=log,
    )
    for name, content in launch.files.items():
        write_json(getattr(paths, name), content)
    save_plan(plan, paths.plan)  # the plan this run trains (a resume checks it)
    log(launch.announce)
    loop_config = {
        "recipe": launch.recipe,
        "plan": plan.model_dump(mode="json"),
        "out_dir": str(paths.root),
        "tracking_uri": ctx.tracking_uri,
        "experiment": ctx.experiment,
        "run_id": tracker.run_id,
        "mlflow_every": mlflow_every,
        **launch.loop_config,
    }
    with ctx.ray_session():
        result = fit_on_ray_train(ctx, plan, train_loop_per_worker, loop_config, tracker)
    metrics = dict(result.metrics or {})
    stopped = _read_json(paths.progress)  # rank 0's own word: Ray Train may return an earlier report's metrics
    if stopped.get("status") == "preempted":
        step, kept = stopped.get("step"), stopped.get("checkpoint_step")
        tracker.set_tags({"hpt.preempted_at_step": step, "hpt.checkpoint_step": kept})
        tracker.end("KILLED")
        raise TrainingPreempted(
            f"the large run stopped at step {step}/{plan.target.steps} on SIGTERM (preemption); its checkpoint of "
            f"step {kept} is kept under {paths.ray_storage} and MLflow run {tracker.run_id} is marked KILLED. "
            "Continue with the same `hpt run` (it resumes), or `hpt train PLAN --resume`; a RayJob retries on "
            "this exit status (75)"
        )
    for path in (paths.metrics, *(getattr(paths, n) for n in launch.files), paths.plan, paths.hf_model):
        if path.exists():
            tracker.log_artifact(path)
    tracker.log_metrics({f"final_{k}": v for k, v in metrics.items() if k in FINAL_METRICS})
    if placed := (_read_json(paths.metrics).get("final") or {}).get("placement"):  # rank 0's record
        tracker.set_tags({"hpt.nodes": placed["nodes"]})
        if placed["nodes"] > 1:
            log(f"large run: its {len(placed['ranks'])} ranks ran on {placed['nodes']} nodes")
    tracker.end("FINISHED" if metrics.get("status") == "ok" else "FAILED")
    if launch.summary:
        log(launch.summary(metrics))
    metrics["mlflow_run_id"] = tracker.run_id
    metrics["checkpoint"] = result.checkpoint.path if result.checkpoint else None
    return metrics


def train_tracker(ctx: StudyContext, plan: TransferPlan, *, tags: dict, params: dict, log=print):
    """The study's MLflow run of this large run, never sinking training when MLflow is down
    (tracking.Spooled). A run continued in the same train/ folder (a resume after a stop, a
    preemption or a killed driver) logs into the run recorded in train/mlflow_run.json, set back
    to RUNNING, so a study has one run per large run: none duplicated, none left RUNNING. What an
    earlier outage left unsent is delivered first."""
    from hptransfer.tracking import PENDING, TAG_KIND, TAG_STUDY, Spooled, client

    paths = ctx.paths.train
    run_id = deliver_unsent(ctx, log)
    mlflow_client = client(ctx.tracking_uri)
    try:
        logged = mlflow_client.get_run(run_id).data.params if run_id and not run_id.startswith(PENDING) else None
    except Exception:  # not in this tracking store (another --tracking-uri), or MLflow down: a new run
        logged = None
    if run_id and run_id.startswith(PENDING):
        # Still not created (MLflow down since this run first started): go on spooling into it.
        log(f"MLflow: still unreachable at {ctx.tracking_uri}; this run's records stay in {paths.mlflow_unsent}")
        return Spooled(ctx.tracker(run_id=run_id), paths.mlflow_unsent, ctx.tracking_uri)
    if logged is None:
        run_name = f"{plan.study}-train"
        try:
            tracker = ctx.tracker(run_name, kind="train", tags=tags)
        except Exception as e:  # MLflow down as the run starts: training does not wait for it
            all_tags = {TAG_STUDY: str(ctx.root), TAG_KIND: "train", **tags}
            spooled = Spooled.pending(paths.mlflow_unsent, ctx.tracking_uri, ctx.experiment, run_name, all_tags)
            write_json(paths.mlflow_run, {"run_id": spooled.run_id, "tracking_uri": ctx.tracking_uri, "pending": True})
            log(
                f"MLflow: unreachable at {ctx.tracking_uri} ({type(e).__name__}); training starts anyway and its "
                f"records go to {paths.mlflow_unsent}, delivered (the run created first) when MLflow answers: by the "
                "next write, the next `hpt train`/`hpt run`, or `hpt status --replay-mlflow`"
            )
            spooled.log_params(params)
            return spooled
        write_json(paths.mlflow_run, {"run_id": tracker.run_id, "tracking_uri": ctx.tracking_uri})
        logged = {}
    else:
        tracker = ctx.tracker(run_id=run_id)
        mlflow_client.update_run(run_id, status="RUNNING")
        log(f"MLflow: continuing run {run_id}")
    spooled = Spooled(tracker, paths.mlflow_unsent, ctx.tracking_uri)
    # A parameter is logged once (MLflow refuses a changed value): a resume with another scale knob keeps the first.
    spooled.log_params({k: v for k, v in params.items() if k not in logged})
    return spooled


def deliver_unsent(ctx: StudyContext, log=print) -> str | None:
    """What an MLflow outage left in train/mlflow_unsent.jsonl, delivered now if MLflow answers (a run
    started while it was down is created first, and train/mlflow_run.json then names it). Returns the
    large run's MLflow run id as recorded (a `pending-…` id while it is still not created)."""
    from hptransfer.tracking import PENDING, describe_unsent, fail_quickly, read_unsent, real_run_id, replay_unsent

    paths = ctx.paths.train
    fail_quickly()
    if paths.mlflow_unsent.exists():
        what = describe_unsent(read_unsent(paths.mlflow_unsent))
        ok = replay_unsent(paths.mlflow_unsent, ctx.tracking_uri)
        log(f"MLflow: {'delivered' if ok else 'still could not deliver'} what an earlier outage left unsent: {what}")
    run_id = _recorded_run(paths.mlflow_run)
    if run_id and run_id.startswith(PENDING):  # made while MLflow was down: the run it became, if it has
        real = real_run_id(paths.mlflow_unsent, run_id)
        if real:
            write_json(paths.mlflow_run, {"run_id": real, "tracking_uri": ctx.tracking_uri})
        run_id = real or run_id
    return run_id


def _read_json(path: Path) -> dict:
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _recorded_run(path: Path) -> str | None:
    run_id = _read_json(path).get("run_id")
    return str(run_id) if run_id else None


def stop_on_sigterm(paths, log_line):
    """While Ray Train runs: SIGTERM writes train/stop_request.json, which rank 0 checks after every
    step; the workers stop at that boundary (train/loop.py: WorkerKit.stop). Only in the main
    thread (Python's rule for signal handlers); the previous handler comes back afterwards."""
    import contextlib
    import signal
    import threading
    import time

    @contextlib.contextmanager
    def installed():
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        from hptransfer.preempt import log_later

        def handler(signum, frame):
            if not paths.stop_request.exists():
                write_json(paths.stop_request, {"signal": "SIGTERM", "time": time.time()})
                log_later(log_line, "train: SIGTERM: stopping at the next step boundary, after a checkpoint")

        previous = signal.signal(signal.SIGTERM, handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)

    return installed()


def run_params(plan: TransferPlan) -> dict:
    """The MLflow parameters of every large run (a recipe adds its own)."""
    return {
        "width": plan.target.width,
        "steps": plan.target.steps,
        "batch_size": plan.target.batch_size,
        "rule": plan.rule,
        "parametrization": plan.model.parametrization,
        "family": plan.model.family,
        "depth": plan.model.depth,
        "workers": plan.train.workers,
    }


def prepare_train_dir(ctx: StudyContext, plan: TransferPlan, *, resume: bool, restart: bool, log=print) -> bool:
    """The train/ folder before a run (large or private): a restart moves the previous run aside, a
    plain rerun over one is refused, a resume must be of the same model. Returns True when a
    previous run of the same model is being continued."""
    paths = ctx.paths.train
    paths.root.mkdir(parents=True, exist_ok=True)
    logs.attach(ctx.paths.log_file)
    previous = paths.ray_experiment
    if previous.exists() and restart:
        replaced_run = _recorded_run(paths.mlflow_run)
        aside = ctx.move_aside(
            paths.ray_storage,
            paths.metrics,
            paths.hf_model,
            paths.progress,
            paths.progress_log,
            paths.plan,
            paths.mlflow_run,  # the restarted run gets a run of its own
            paths.stop_request,
        )
        log(f"restart: the previous large run was moved to {aside}")
        if replaced_run:
            close_replaced_run(ctx, replaced_run, aside, log=log)
        return False
    if previous.exists() and not resume:
        raise PlanError(
            f"{paths.root} already holds a training run; pass --resume to continue it from its latest "
            "checkpoint, or --restart to discard it"
        )
    if previous.exists() and paths.plan.is_file():
        _check_same_model(paths.plan, plan)
        return True
    return False


def close_replaced_run(ctx: StudyContext, run_id: str, aside: Path, *, log=print) -> None:
    """The MLflow run of a large run that --restart replaced: tagged `hpt.replaced` (where its files
    went) and, if it was still open (a killed driver leaves it RUNNING), ended KILLED, so the
    experiment shows one live run. A finished or stopped run keeps its status. MLflow down: said,
    not raised (the restart goes on; the old run is left as it was)."""
    from hptransfer.tracking import client, fail_quickly

    fail_quickly()
    try:
        c = client(ctx.tracking_uri)
        status = c.get_run(run_id).info.status
        c.set_tag(run_id, "hpt.replaced", f"--restart moved its files to {aside}")
        if status in ("RUNNING", "SCHEDULED"):
            c.set_terminated(run_id, status="KILLED")
            log(f"MLflow: the replaced run {run_id} was still {status}: ended KILLED")
    except Exception as e:  # not in this store, or MLflow unreachable
        log(f"MLflow: could not close the replaced run {run_id} ({type(e).__name__}: {str(e)[:160]}); it is left as it was")


def fit_on_ray_train(ctx: StudyContext, plan: TransferPlan, loop, loop_config: dict, tracker):
    """One Ray Train run of `loop` at the plan's scale (gloo on CPU, NCCL with GPUs); rank 0's
    progress lines are shown while it runs. Same name and storage path every time: Ray Train
    restores its checkpoint manager and hands the loop the latest checkpoint (`get_checkpoint`) —
    both after a worker dies and on --resume. A run that stops for good ends its MLflow run FAILED
    and raises `TrainingStopped` (naming `train.max_failures` and the resume) from Ray's error."""
    import ray.train
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    paths, gpus = ctx.paths.train, plan.train.gpus_per_worker
    lo, hi = plan.train.worker_range
    trainer = TorchTrainer(
        loop,
        train_loop_config=loop_config,
        scaling_config=ScalingConfig(
            # (min, max): Ray Train's elastic group, resized to what the cluster can place (train.min_workers).
            num_workers=plan.train.workers if lo == hi else (lo, hi),
            use_gpu=gpus > 0,
            resources_per_worker={"CPU": plan.train.cpus_per_worker, **({"GPU": gpus} if gpus else {})},
        ),
        torch_config=TorchConfig(backend="nccl" if gpus else "gloo"),
        run_config=RunConfig(
            name=TRAIN_EXPERIMENT,
            storage_path=str(paths.ray_storage),
            # Ray Train V2 retries a worker group it cannot place (a node lost: not enough CPUs/GPUs
            # left) every RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (60 s) without limit by default: the
            # run would hang. Bounded, it stops with the error below instead; at least 3 tries, so a
            # slow start on a loaded machine (or a node being replaced) is not mistaken for a lost one.
            failure_config=FailureConfig(
                max_failures=plan.train.max_failures, controller_failure_limit=placement_tries(plan) - 1
            ),
            checkpoint_config=CheckpointConfig(num_to_keep=plan.train.keep_checkpoints),
        ),
    )

    def line(text: str) -> None:  # joins rank 0's lines, which the driver prints
        with paths.progress_log.open("a", encoding="utf-8") as f:
            f.write(text + "\n")

    try:
        with logs.follow(paths.progress_log), stop_on_sigterm(paths, line):
            return trainer.fit()
    except ray.train.TrainingFailedError as e:
        tracker.end("FAILED")
        cause = str(e).strip().splitlines()
        if "worker group startup timed out" in str(e):
            need = f"{plan.train.workers} workers × {plan.train.cpus_per_worker:g} CPU" + (f" + {gpus:g} GPU" if gpus else "")
            raise TrainingStopped(
                f"the large run stopped: the cluster could not place its {need} "
                f"({placement_tries(plan)} tries; a node lost or preempted?). Its latest checkpoint is kept under "
                f"{paths.ray_storage}: once the cluster has room again, continue with the same `hpt train` and --resume "
                "(or the same `hpt run`)"
            ) from e
        raise TrainingStopped(
            f"the large run stopped: a worker failed and train.max_failures={plan.train.max_failures} "
            f"restart(s) were allowed. Its latest checkpoint is kept under {paths.ray_storage}: continue "
            "from it with the same `hpt train` and --resume (Python: resume=True), or raise "
            f"train.max_failures to let Ray Train restart failed workers. Ray's error: {cause[-1] if cause else e!r}"
        ) from e
    except Exception:
        tracker.end("FAILED")
        raise


def placement_tries(plan: TransferPlan) -> int:
    """How often Ray Train tries to place the worker group before the run stops (each try waits
    RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S, 60 s by default)."""
    return max(plan.train.max_failures, 2) + 1


def _check_same_model(previous_plan: Path, plan: TransferPlan) -> None:
    """A resume must train the model the checkpoint holds: same family, shape and width."""
    from hptransfer.plan import load_plan

    old = load_plan(previous_plan)
    keys = {
        "model": (old.model.model_dump(), plan.model.model_dump()),
        "target.width": (old.target.width, plan.target.width),
        "base_width": (old.base_width, plan.base_width),
    }
    diff = [f"{k}: checkpoint has {a}, plan has {b}" for k, (a, b) in keys.items() if a != b]
    if diff:
        raise PlanError(
            f"cannot resume: the checkpoint in {previous_plan.parent} is of another model ("
            + "; ".join(diff)
            + "); pass --restart to discard it, or another --study-dir"
        )
