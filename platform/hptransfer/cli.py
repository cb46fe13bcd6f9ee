"""`hpt`: one verb per pipeline stage. Heavy imports (ray, torch, deepspeed) happen inside commands
so `hpt --help` answers at once."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="hpt",
    help="Tune small widths on Ray, transfer the hyperparameters to a large target, train it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


import json
from pathlib import Path
from typing import Optional

from rich.console import Console

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)

SPEC = typer.Argument(..., exists=False, help="Study spec YAML (see search_spaces/).")
STUDY_DIR = typer.Option(None, "--study-dir", "-o", help="Study folder for results. Default: studies/<spec name>.")
TRACKING = typer.Option(None, "--tracking-uri", help="MLflow tracking URI (an `mlflow server` URL or sqlite:///...). "
                        "Default: spec's tracking.uri, else $MLFLOW_TRACKING_URI, else sqlite:///<study-dir>/mlflow.db.")
ADDRESS = typer.Option(None, "--address", help="Existing Ray cluster address (e.g. ray://head:10001 or auto). "
                       "Default: start a local Ray with the spec's ray.num_cpus.")


def _load(spec_path: Path):
    from hptransfer.env import configure
    from hptransfer.spec import SpecError, load_spec

    configure()
    try:
        return load_spec(spec_path)
    except SpecError as e:
        err.print(f"[red]invalid spec[/red] {e}")
        raise typer.Exit(2)


def _fail(msg: str, code: int = 2):
    err.print(f"[red]error:[/red] {msg}")
    raise typer.Exit(code)


@app.command()
def validate(spec: Path = SPEC):
    """Check a study spec; print every problem at once (YAML path, bad value, what is allowed). Exit 2 if invalid."""
    s = _load(spec)
    console.print(f"[green]ok[/green] {spec}: study {s.name!r}, {s.model.family}/{s.model.parametrization}, "
                  f"widths {s.sweep.widths} → target {s.target.width}, grid {dict(s.sweep.grid)}, rule {s.transfer.rule}")


@app.command("coord-check")
def coord_check_cmd(spec: Path = SPEC, study_dir: Optional[Path] = STUDY_DIR,
                    widths: Optional[str] = typer.Option(None, help="Comma-separated widths. Default: spec's coord_check.widths or the sweep ladder.")):
    """Train a few Adam steps at each width and check that activation sizes stay flat (µP) or not (SP).
    Writes coord_check.png and coord_check.json; exits 1 when activations grow with width."""
    from hptransfer.coordcheck import coord_check, describe
    from hptransfer.pipeline import default_study_dir

    s = _load(spec)
    out = Path(study_dir or default_study_dir(s))
    r = coord_check(s, out, widths=[int(w) for w in widths.split(",")] if widths else None)
    console.print(describe(r))
    console.print(f"plot: {r.files['plot']}\nnumbers: {r.files['data']}")
    if not r.passed:
        raise typer.Exit(1)


@app.command()
def sweep(spec: Path = SPEC, study_dir: Optional[Path] = STUDY_DIR, tracking_uri: Optional[str] = TRACKING,
          address: Optional[str] = ADDRESS,
          restart: bool = typer.Option(False, "--restart", help="Discard an interrupted sweep in the study folder and start over.")):
    """Run widths × hyperparameter grid × seeds as Ray Tune trials. Writes sweep_results.csv and sweep.png
    and logs a parent MLflow run with one child per trial. Re-running resumes an interrupted sweep."""
    from hptransfer.pipeline import sweep_stage
    from hptransfer.sweep.runner import SweepError

    s = _load(spec)
    try:
        df, run_id = sweep_stage(s, study_dir, tracking_uri=tracking_uri, address=address, restart=restart, log=console.print)
    except SweepError as e:
        _fail(str(e))
    console.print(df.drop(columns=["error", "trial_id"], errors="ignore").to_string(index=False))
    console.print(f"MLflow parent run: {run_id}")


@app.command()
def train(plan: Path = typer.Argument(..., help="transfer_plan.yaml written by `hpt transfer`."),
          study_dir: Optional[Path] = typer.Option(None, "--study-dir", "-o", help="Default: the plan's folder."),
          tracking_uri: Optional[str] = TRACKING, address: Optional[str] = ADDRESS,
          workers: Optional[int] = typer.Option(None, help="Ray Train workers (DeepSpeed ranks). Default: the plan's train.workers."),
          gpus_per_worker: Optional[float] = typer.Option(None, "--gpus-per-worker", help="GPUs per worker (NCCL and bf16 when > 0). Default: the plan's train.gpus_per_worker."),
          cpus_per_worker: Optional[float] = typer.Option(None, "--cpus-per-worker", help="CPUs per worker (also its torch threads). Default: the plan's."),
          resume: bool = typer.Option(False, "--resume", help="Continue a stopped run from its latest checkpoint."),
          restart: bool = typer.Option(False, "--restart", help="Discard a previous run in the same folder and start over.")):
    """Train the target model from a plan with Ray Train + DeepSpeed (CPU/gloo here, GPU/NCCL when present)."""
    from hptransfer.env import configure
    from hptransfer.pipeline import train_stage
    from hptransfer.train.dsconfig import PlanError

    configure()
    if not plan.is_file():
        _fail(f"plan not found: {plan} (make one with `hpt transfer`)")
    try:
        metrics = train_stage(plan, study_dir, tracking_uri=tracking_uri, address=address, workers=workers,
                              gpus_per_worker=gpus_per_worker, cpus_per_worker=cpus_per_worker,
                              resume=resume, restart=restart, log=console.print)
    except PlanError as e:
        _fail(str(e))
    console.print(json.dumps(metrics, indent=2, default=str))


@app.command("dp-sweep")
def dp_sweep(spec: Path = SPEC, study_dir: Optional[Path] = STUDY_DIR, tracking_uri: Optional[str] = TRACKING,
             address: Optional[str] = ADDRESS,
             epsilons: Optional[str] = typer.Option(None, help="Comma-separated ε values. Default: the spec's dp.epsilon."),
             lrs: Optional[str] = typer.Option(None, help="Comma-separated learning rates. Default: the spec's dp.lr."),
             seeds: Optional[str] = typer.Option(None, help="Comma-separated seeds. Default: the spec's sweep.seeds.")):
    """DP fine-tuning trials over (ε, batch size, clipping bound, LR) on Ray Tune, on the offline digits
    transfer task: B from each ε's feasible batch sizes, C from its plan's grid. Writes dp_sweep_results.csv
    and dp_sweep.png and logs a parent MLflow run with one child per trial."""
    from hptransfer.dp.plan import DPPlanError
    from hptransfer.dp.sweep import run_dp_sweep
    from hptransfer.pipeline import default_study_dir

    s = _load(spec)
    floats = lambda text: [float(x) for x in text.split(",")] if text else None  # noqa: E731
    try:
        df = run_dp_sweep(s, study_dir or default_study_dir(s), epsilons=floats(epsilons), lrs=floats(lrs),
                          seeds=[int(x) for x in seeds.split(",")] if seeds else None, tracking_uri=tracking_uri,
                          address=address, log=console.print)
    except (DPPlanError, ValueError) as e:
        _fail(str(e))
    best = df[df.status == "ok"].sort_values("test_accuracy").groupby("epsilon").tail(1)
    console.print("best per ε:\n" + best.to_string(index=False))


@app.command()
def run(spec: Path = SPEC, study_dir: Optional[Path] = STUDY_DIR, tracking_uri: Optional[str] = TRACKING,
        address: Optional[str] = ADDRESS, restart: bool = typer.Option(False, "--restart", help="Start the sweep over."),
        skip_coord_check: bool = typer.Option(False, "--skip-coord-check")):
    """The whole pipeline: validate → coord-check → sweep → transfer → train. Prints where everything is."""
    from hptransfer.pipeline import run_study
    from hptransfer.sweep.runner import SweepError
    from hptransfer.train.dsconfig import PlanError

    s = _load(spec)
    try:
        out = run_study(s, study_dir, tracking_uri=tracking_uri, address=address, restart=restart,
                        skip_coord_check=skip_coord_check, log=console.print)
    except (SweepError, PlanError) as e:
        _fail(str(e))
    console.rule("[bold]study done")
    for k in ("study_dir", "results", "plan", "train_metrics", "report", "tracking_uri"):
        console.print(f"{k:>14}: {out[k]}")
    console.print(f"{'final':>14}: {out['final']}")
    console.print(f"{'times':>14}: " + ", ".join(f"{k}={v:.0f}" for k, v in out["times"].items()))
    console.print(f"\nBrowse runs: mlflow ui --backend-store-uri {out['tracking_uri']}")


# --- sub-commands owned by other modules ---
from hptransfer.dp import cli as dp_cli  # noqa: E402

app.command("dp-plan")(dp_cli.dp_plan)
from hptransfer.transfer import cli as transfer_cli  # noqa: E402

app.command("transfer")(transfer_cli.transfer)
app.command("export")(transfer_cli.export)
from hptransfer.deploy import cli as deploy_cli  # noqa: E402

app.add_typer(deploy_cli.app, name="k8s")
from hptransfer.report import cli as report_cli  # noqa: E402

app.command("report")(report_cli.report)
# --- end of sub-commands owned by other modules ---
