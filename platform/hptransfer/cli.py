"""`hpt`: one verb per pipeline stage. Each verb builds one `Study` from the spec and its flags and
calls the stage function (`hptransfer.pipeline`, which takes the study's lock). Heavy imports (ray,
torch, deepspeed) happen inside commands so `hpt --help` answers at once. User errors exit 2 in one
format (console.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from hptransfer.console import console, fail, user_errors

app = typer.Typer(
    name="hpt",
    help="Tune small widths on Ray, transfer the hyperparameters to a large target, train it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

SPEC = typer.Argument(..., exists=False, help="Study spec YAML (see search_spaces/).")
STUDY_DIR = typer.Option(None, "--study-dir", "-o", help="Study folder for results. Default: studies/<spec name>.")
TRACKING = typer.Option(
    None,
    "--tracking-uri",
    help="MLflow tracking URI (an `mlflow server` URL or sqlite:///...). "
    "Default: spec's tracking.uri, else $MLFLOW_TRACKING_URI, else sqlite:///<study-dir>/mlflow.db.",
)
ADDRESS = typer.Option(
    None,
    "--address",
    help="Existing Ray cluster address (e.g. ray://head:10001 or auto). Default: start a local Ray with the spec's ray.num_cpus.",
)


def _study(spec: Path, study_dir: Path | None = None, tracking_uri: str | None = None, address: str | None = None):
    from hptransfer.env import configure
    from hptransfer.pipeline import Study

    configure()
    return Study.from_spec(spec, study_dir, tracking_uri=tracking_uri, address=address)


@app.callback()
def main(
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="Show on the console everything Ray, Ray Train, "
        "DeepSpeed and MLflow print; by default it goes only to <study-dir>/hpt.log.",
    ),
):
    from hptransfer import logs

    logs.set_verbose(verbose)


@app.command()
@user_errors
def validate(spec: Path = SPEC):
    """Check a study spec; print every problem at once (YAML path, bad value, what is allowed). Exit 2 if invalid."""
    s = _study(spec).spec
    console.print(
        f"[green]ok[/green] {escape(str(spec))}: "
        + escape(
            f"study {s.name!r}, {s.model.family}/{s.model.parametrization}, widths {s.sweep.widths} → target "
            f"{s.target.width}, grid {dict(s.sweep.grid)}, {s.sweep.n_trials} trials, rule {s.transfer.rule}"
            + (_finetune_line(s) if s.dp is not None and s.dp.finetunes_pretrained else "")
        )
    )


def _finetune_line(s) -> str:
    from hptransfer.dp.finetune import sweep_settings

    f = sweep_settings(s)
    if s.dp.tuning == "private":
        t = s.dp.private_tuning
        return (
            f"; then DP fine-tuning from the large run on corpus {(s.dp.data or s.data).corpus!r}, tuned on it privately: "
            f"C a DP {t.quantile:g}-quantile, a random number of DP trials (E[K] = {t.expected_trials:g}) over "
            f"batch sizes {s.dp.resolved_batch_sizes()} × lrs {f.lrs} at width {f.widths[0]}; the whole study ε ≤ "
            f"{s.dp.epsilon:g} (the tuning's share {t.share:g})"
        )
    return (
        f"; then DP fine-tuning from the large run on corpus {(s.dp.data or s.data).corpus!r}: DP sweep widths "
        f"{f.widths}, ε {f.epsilons}, lrs {f.lrs}, seeds {f.seeds}; private run ε ≤ {s.dp.epsilon:g}"
    )


@app.command("coord-check")
@user_errors
def coord_check_cmd(
    spec: Path = SPEC,
    study_dir: Optional[Path] = STUDY_DIR,
    widths: Optional[str] = typer.Option(
        None, help="Comma-separated widths. Default: spec's coord_check.widths or the sweep ladder."
    ),
    depths: Optional[str] = typer.Option(
        None, help="Comma-separated depths for the check over depth. Default: spec's coord_check.depths (none: no depth check)."
    ),
):
    """Train a few Adam steps at each width and check that activation sizes stay flat (µP) or not (SP);
    with depths, also check the residual stream against depth (depth_parametrization). Writes
    coord_check.png/.json (and coord_check_depth.png/.json); exits 1 when a check fails."""
    from hptransfer.coordcheck import describe
    from hptransfer.pipeline import coord_check_depth_stage, coord_check_stage

    parsed = {}
    for flag, text in (("--widths", widths), ("--depths", depths)):
        try:
            parsed[flag] = [int(w) for w in text.split(",")] if text else None
        except ValueError:
            fail(f"{flag} must be comma-separated integers, got {text!r}")
    study = _study(spec, study_dir)
    r = coord_check_stage(study, widths=parsed["--widths"])
    console.print(describe(r), markup=False)
    console.print(f"plot: {r.files['plot']}\nnumbers: {r.files['data']}", markup=False)
    passed = r.passed
    if parsed["--depths"] or study.require_spec().coord_check.depths:
        from hptransfer.coordcheck_depth import describe as describe_depth

        d = coord_check_depth_stage(study, depths=parsed["--depths"])
        console.print(describe_depth(d), markup=False)
        console.print(f"plot: {d.files['plot']}\nnumbers: {d.files['data']}", markup=False)
        passed = passed and d.passed
    if not passed:
        raise typer.Exit(1)


@app.command()
@user_errors
def sweep(
    spec: Path = SPEC,
    study_dir: Optional[Path] = STUDY_DIR,
    tracking_uri: Optional[str] = TRACKING,
    address: Optional[str] = ADDRESS,
    restart: bool = typer.Option(
        False, "--restart", help="Start the sweep over; the previous one is moved to STUDY_DIR/replaced/ (never deleted)."
    ),
):
    """Run widths × hyperparameter grid × seeds as Ray Tune trials. Writes sweep_results.csv and sweep.png
    and logs a parent MLflow run with one child per trial. Re-running resumes an interrupted sweep."""
    from hptransfer.pipeline import sweep_stage

    out = sweep_stage(_study(spec, study_dir, tracking_uri, address), restart=restart, log=console.print)
    console.print(out.table.drop(columns=["error", "trial_id"], errors="ignore").to_string(index=False), markup=False)
    console.print(f"MLflow parent run: {out.mlflow_run_id}")


@app.command()
@user_errors
def train(
    plan: Path = typer.Argument(..., help="transfer_plan.yaml written by `hpt transfer`."),
    study_dir: Optional[Path] = typer.Option(None, "--study-dir", "-o", help="Default: the plan's folder."),
    tracking_uri: Optional[str] = TRACKING,
    address: Optional[str] = ADDRESS,
    workers: Optional[int] = typer.Option(
        None, min=1, help="Ray Train workers (DeepSpeed ranks). Default: the plan's train.workers."
    ),
    gpus_per_worker: Optional[float] = typer.Option(
        None,
        "--gpus-per-worker",
        min=0,
        help="GPUs per worker (NCCL when > 0; bf16 follows the plan's train.precision). Default: the plan's train.gpus_per_worker.",
    ),
    cpus_per_worker: Optional[float] = typer.Option(
        None, "--cpus-per-worker", min=0.01, help="CPUs per worker (also its torch threads). Default: the plan's."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue a stopped run from its latest checkpoint (refused if the plan is for another model)."
    ),
    restart: bool = typer.Option(
        False, "--restart", help="Start the large run over; the previous one is moved to STUDY_DIR/replaced/ (never deleted)."
    ),
):
    """Train the target model from a plan with Ray Train + DeepSpeed (CPU/gloo here, GPU/NCCL when present).
    The study's MLflow settings come from the plan folder's spec.yaml when there is one."""
    from hptransfer.env import configure
    from hptransfer.pipeline import Study, train_stage
    from hptransfer.plan import load_plan

    configure()
    p = load_plan(plan)
    study = Study.for_plan(plan, study_dir, tracking_uri=tracking_uri, address=address)
    metrics = train_stage(
        study,
        p,
        workers=workers,
        gpus_per_worker=gpus_per_worker,
        cpus_per_worker=cpus_per_worker,
        resume=resume,
        restart=restart,
        log=console.print,
    )
    console.print(json.dumps(metrics, indent=2, default=str), markup=False)


@app.command("dp-sweep")
@user_errors
def dp_sweep(
    spec: Path = SPEC,
    study_dir: Optional[Path] = STUDY_DIR,
    tracking_uri: Optional[str] = TRACKING,
    address: Optional[str] = ADDRESS,
    task: str = typer.Option(
        "lm",
        "--task",
        help="lm: the spec's model DP-fine-tuned on the private sequences of its corpus, scored by validation "
        "loss; digits: the offline digits transfer task, scored by test accuracy.",
    ),
    width: Optional[int] = typer.Option(None, "--width", min=1, help="lm: the model width. Default: the spec's base width."),
    epsilons: Optional[str] = typer.Option(
        None,
        help="Comma-separated ε values; inf adds the noise-free arm (σ = 0), the step curve of dp.batch_rule predicted-loss. Default: the spec's dp.epsilon.",
    ),
    lrs: Optional[str] = typer.Option(None, help="Comma-separated learning rates. Default: the spec's dp.lr."),
    seeds: Optional[str] = typer.Option(None, help="Comma-separated seeds. Default: the spec's sweep.seeds."),
    restart: bool = typer.Option(
        False, "--restart", help="Start the DP sweep over; the previous one is moved to STUDY_DIR/replaced/."
    ),
):
    """DP fine-tuning trials over (ε, batch size, clipping bound, LR) on Ray Tune: B from each ε's feasible
    batch sizes, C from its plan's grid, ε spent checked per trial. Default task: the spec's language model
    on its corpus (Opacus, Poisson sampling, normalized clipping, one process per trial). Runs on the main
    sweep's machinery (resume, resource check, progress); writes dp_sweep_results.csv and dp_sweep.png and
    logs a parent MLflow run with one child per trial."""
    from hptransfer.dp.sweep import KINDS, TASKS, best_per_epsilon
    from hptransfer.pipeline import dp_sweep_stage

    def numbers(text: str | None, kind, flag: str):
        try:
            return [kind(x) for x in text.split(",")] if text else None
        except ValueError:
            fail(f"{flag} must be comma-separated numbers, got {text!r}")

    if task not in TASKS:
        fail(f"--task must be one of {', '.join(TASKS)}, got {task!r}")
    df = dp_sweep_stage(
        _study(spec, study_dir, tracking_uri, address),
        task=task,
        width=width,
        epsilons=numbers(epsilons, float, "--epsilons"),
        lrs=numbers(lrs, float, "--lrs"),
        seeds=numbers(seeds, int, "--seeds"),
        restart=restart,
        log=console.print,
    )
    best = best_per_epsilon(df, KINDS[task]).drop(columns=["error", "trial_id"], errors="ignore")
    console.print("best per ε:\n" + best.to_string(index=False), markup=False)


@app.command()
@user_errors
def run(
    spec: Path = SPEC,
    study_dir: Optional[Path] = STUDY_DIR,
    tracking_uri: Optional[str] = TRACKING,
    address: Optional[str] = ADDRESS,
    restart_sweep: bool = typer.Option(
        False,
        "--restart-sweep",
        help="Start the sweep over (the previous one is moved to STUDY_DIR/replaced/). Default: resume it.",
    ),
    restart_train: bool = typer.Option(
        False,
        "--restart-train",
        help="Start the large run over (the previous one is moved to STUDY_DIR/replaced/). Default: continue it.",
    ),
    skip_coord_check: bool = typer.Option(False, "--skip-coord-check"),
    until: Optional[str] = typer.Option(
        None,
        "--until",
        help="`transfer`: stop after the plan (the report is written; a later `hpt run` trains it), e.g. to hand "
        "the plan to another trainer (`hpt handoff`). Default: everything.",
        metavar="transfer|train",
    ),
):
    """The whole pipeline on one Ray: validate → coord-check → sweep → transfer → train → report; with
    `dp.init_from: pretrain`, then DP sweep(s) → private plan → private run from the large run's model.
    A re-run resumes each stage (finished trials and checkpoints are kept). Prints where everything is."""
    from hptransfer.pipeline import run_study

    if until not in (None, "transfer", "train"):
        fail(f"--until {until!r} is not a stage it can stop after", where="--until", fix="use --until transfer (or train)")
    out = run_study(
        _study(spec, study_dir, tracking_uri, address),
        restart_sweep=restart_sweep,
        restart_train=restart_train,
        skip_coord_check=skip_coord_check,
        until=until,
        log=console.print,
    )
    console.rule("[bold]study done" if until != "transfer" else "[bold]study planned (--until transfer)")
    for k in ("study_dir", "results", "plan", "train_metrics", "report", "tracking_uri"):
        console.print(f"{k:>14}: {out[k]}", markup=False)
    console.print(f"{'final':>14}: {out['final']}", markup=False)
    if out.get("private"):  # the fine-tuning regime (dp.init_from: pretrain)
        for k in ("plan", "train_metrics", "across_width", "final"):
            console.print(f"{'private ' + k:>22}: {out['private'][k]}", markup=False)
    console.print(f"{'times':>14}: " + ", ".join(f"{k}={v:.0f}" for k, v in out["times"].items()))
    console.print(f"\nBrowse runs: mlflow ui --backend-store-uri {out['tracking_uri']}", markup=False)


@app.command()
@user_errors
def status(
    study_dir: Path = typer.Argument(..., help="A study folder (the study_dir `hpt run` prints)."),
    tracking_uri: Optional[str] = TRACKING,
    as_json: bool = typer.Option(False, "--json", help="One JSON object instead of lines, for scripts."),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Skip listing the MLflow runs (faster; no tracker contact)."),
    replay_mlflow: bool = typer.Option(
        False, "--replay-mlflow", help="First deliver to MLflow what an outage left unsent (train/mlflow_unsent.jsonl)."
    ),
):
    """Where a study stands, from its folder alone (starts nothing): each stage done / running / interrupted,
    the coordinate check's verdict, sweep trials by status, the large run's step, tokens/s and ETA, final
    metrics, where the files are, and the MLflow tracking URI, experiment and run ids."""
    from hptransfer.env import configure
    from hptransfer.status import describe, study_status

    configure()
    if replay_mlflow:
        from hptransfer.status import replay_mlflow as replay

        console.print(replay(study_dir, tracking_uri=tracking_uri), markup=False)
    st = study_status(study_dir, tracking_uri=tracking_uri, mlflow=not no_mlflow)
    typer.echo(json.dumps(st, indent=2, default=str) if as_json else "\n".join(describe(st)))


# --- sub-commands owned by other modules ---
from hptransfer.deploy import cli as deploy_cli
from hptransfer.dp import cli as dp_cli
from hptransfer.handoff import cli as handoff_cli
from hptransfer.report import cli as report_cli
from hptransfer.transfer import cli as transfer_cli

app.command("dp-plan")(dp_cli.dp_plan)
app.command("transfer")(transfer_cli.transfer)
app.command("export")(transfer_cli.export)
app.command("handoff")(handoff_cli.handoff)
app.add_typer(deploy_cli.app, name="k8s")
app.command("report")(report_cli.report)
from hptransfer.data import cli as data_cli

app.add_typer(data_cli.app, name="data")
