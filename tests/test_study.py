"""`Study`: one resolution of the tracking URI and experiment, the study's paths and identity, the
error format and exit status of every verb, the package's import graph, and the notebook API."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hptransfer.spec import parse_spec
from hptransfer.study import Study, StudyPaths

from conftest import ROOT, tiny_spec_dict

PKG = ROOT / "platform" / "hptransfer"


# --- tracking URI and experiment: flag > spec > environment > default --------------------------


@pytest.mark.parametrize(
    "flag,spec_uri,env,expected",
    [
        ("sqlite:///flag.db", "sqlite:///spec.db", "sqlite:///env.db", "sqlite:///flag.db"),
        (None, "sqlite:///spec.db", "sqlite:///env.db", "sqlite:///spec.db"),
        (None, None, "sqlite:///env.db", "sqlite:///env.db"),
        (None, None, None, "default"),
    ],
)
def test_tracking_uri_resolution_order(tmp_path, monkeypatch, flag, spec_uri, env, expected):
    if env:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", env)
    spec = parse_spec(tiny_spec_dict(tracking={"uri": spec_uri, "experiment": None}))
    study = Study.from_spec(spec, tmp_path / "s", tracking_uri=flag)
    want = f"sqlite:///{(tmp_path / 's' / 'mlflow.db').resolve()}" if expected == "default" else expected
    assert study.tracking_uri == want
    assert study.experiment == "tiny"
    assert Study.from_spec(parse_spec(tiny_spec_dict(tracking={"experiment": "exp"})), tmp_path).experiment == "exp"


def test_a_plan_without_a_spec_gets_the_same_resolution(tmp_path, monkeypatch):
    from hptransfer.plan import TargetShape, TransferPlan, save_plan

    spec = parse_spec(tiny_spec_dict(name="planonly"))
    plan = TransferPlan(
        study="planonly",
        rule="mup",
        model=spec.model,
        base_width=16,
        target=TargetShape(width=64, steps=4, batch_size=8, seq_len=16),
        hyperparameters={"lr": 0.01},
        data=spec.data,
        train=spec.train,
    )
    path = save_plan(plan, tmp_path / "elsewhere" / "plan.yaml")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///env.db")
    study = Study.for_plan(path)
    assert study.spec is None and study.name == "planonly" and study.tracking_uri == "sqlite:///env.db"
    assert study.root == path.parent.resolve()
    # with the study's own spec beside it, the spec's tracking settings win over the environment
    (path.parent / "spec.yaml").write_text(yaml.safe_dump(tiny_spec_dict(name="planonly", tracking={"uri": "sqlite:///s.db"})))
    assert Study.for_plan(path).tracking_uri == "sqlite:///s.db"


def test_no_study_file_name_is_written_outside_layout_py():
    """Every study file name lives in hptransfer/layout.py (StudyPaths, TrainPaths); other modules
    use those properties."""
    names = {
        Path(getattr(StudyPaths(Path("/s")), a)).name
        for a in dir(StudyPaths)
        if isinstance(getattr(StudyPaths, a, None), property) and a != "train"
    }
    names |= {"train_metrics.json", "deepspeed_config.json", "hf_model", "checkpoints_local", "engine_param_groups.json"}
    names = {n for n in names if "." in n or "_" in n}  # file names, not words like "report" (a verb too)
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.relative_to(PKG) == Path("layout.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno} {node.value!r}")
    assert not offenders, offenders


# --- the import graph: one direction, no cycle ------------------------------------------------------

# Lowest first. A module may import its own layer or a lower one, never a higher one.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # the core: no stage, no contract, no model
    ("core", ("hptransfer", "errors", "io", "env", "logs", "console", "layout", "lock", "tracking", "preempt")),
    # what the stages agree on: the spec, the plan and the context they are handed; `architectures` and
    # `vocab` are what the spec's validation needs of the hf family and the tokenizer folder
    (
        "contracts",
        (
            "spec",
            "plan",
            "plan_diagnostics",
            "hyperparameters",
            "family_defaults",
            "privacy",
            "context",
            "architectures",
            "vocab",
        ),
    ),
    ("models and data", ("models", "data")),
    ("stages", ("coordcheck", "coordcheck_depth", "sweep", "transfer", "handoff", "train", "dp", "report", "status", "deploy")),
    ("facade", ("pipeline", "study")),
    ("CLI", ("cli", "__main__")),  # and every `*/cli.py`
]
# Imports that go up, each with its reason. None today.
UPWARD_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PKG / rel).with_suffix(".py").is_file() or (PKG / rel / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """Every hptransfer module `path` imports, at module level or inside a function; `if
    TYPE_CHECKING:` blocks never run and are left out."""
    out: set[str] = set()

    def walk(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                walk(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hptransfer"):
                subs = {f"{node.module}.{a.name}" for a in node.names}
                sub_modules = {m for m in subs if _is_module(m)}
                out.update(sub_modules)
                if subs - sub_modules:  # names of the module itself (`from pkg import submodule` needs only the submodule)
                    out.add(node.module)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names if a.name.startswith("hptransfer"))
            walk(ast.iter_child_nodes(node))

    walk(ast.parse(path.read_text()).body)
    return out


def import_graph() -> dict[str, set[str]]:
    """module → the package modules it imports. Importing `a.b.c` runs the `__init__` of `a.b` too,
    so that is an edge as well (except for a module inside `a.b`: its package is initialised first)."""
    modules = {_module(p): p for p in PKG.rglob("*.py")}
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    for m, targets in graph.items():
        for target in list(targets):
            parts = target.split(".")
            for k in range(2, len(parts)):
                package = ".".join(parts[:k])
                if package in modules and package != m and not m.startswith(package + "."):
                    targets.add(package)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def layer_of(module: str) -> int:
    parts = module.split(".")
    if module != "hptransfer" and parts[-1] == "cli":
        return len(LAYERS) - 1  # every `*/cli.py` is the CLI
    name = parts[1] if len(parts) > 1 else "hptransfer"
    for i, (_, names) in enumerate(LAYERS):
        if name in names:
            return i
    raise AssertionError(f"{module} is in no layer; add it to LAYERS in tests/test_study.py")


def test_no_import_cycle_anywhere_in_the_package():
    """Function-level imports and package `__init__` imports included (a lazy import is still a
    dependency: it only moves the failure to run time)."""
    graph = import_graph()
    cycles = import_cycles(graph)
    detail = [f"{m} -> {sorted(n for n in graph[m] if n in c)}" for c in cycles for m in c]
    assert not cycles, f"{sum(map(len, cycles))} modules in {len(cycles)} import cycle(s):\n" + "\n".join(detail)


def test_imports_point_one_way():
    """core → contracts → models and data → stages → facade → CLI: every import goes to the same or
    a lower layer (stages may import each other: the cycle test keeps that acyclic). So no module
    below the facade imports `hptransfer.pipeline` or `hptransfer.study`."""
    violations = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {n} ({LAYERS[layer_of(n)][0]})"
        for m, targets in sorted(import_graph().items())
        for n in sorted(targets)
        if layer_of(n) > layer_of(m) and (m, n) not in UPWARD_EXCEPTIONS
    ]
    assert not violations, f"{len(violations)} import(s) against the layers:\n" + "\n".join(violations)


def test_both_tracker_backends_are_trackers():
    """MLflow and the null tracker take the same calls (the protocol stages write through)."""
    import inspect

    from hptransfer.tracking import MlflowTracker, NullTracker, Tracker

    assert isinstance(NullTracker(), Tracker)
    for name in ("log_params", "log_metrics", "log_metric_rows", "log_artifact", "set_tags", "end"):
        want = list(inspect.signature(getattr(Tracker, name)).parameters)
        for backend in (MlflowTracker, NullTracker):
            assert list(inspect.signature(getattr(backend, name)).parameters) == want, (backend.__name__, name)


def test_the_spec_knows_every_registered_rule():
    from hptransfer.spec import RULE_NAMES
    from hptransfer.transfer.rules import RULES

    assert set(RULE_NAMES) == set(RULES)


# --- user errors: exit status 2, one format, no traceback -------------------------------------


def _hpt(*args, cwd=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "hptransfer", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout
    )


def _refused(r, *words):
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "error (" in r.stderr, r.stderr
    for w in words:
        assert w in out, (w, out[-3000:])


def _study_dir(tmp_path, **over) -> Path:
    d = tmp_path / "study"
    d.mkdir()
    (d / "spec.yaml").write_text(yaml.safe_dump(tiny_spec_dict(**over)))
    return d


@pytest.mark.slow  # two `hpt` processes: ~7 s on 2 cores
def test_transfer_before_a_sweep(tmp_path):
    d = _study_dir(tmp_path)
    _refused(_hpt("transfer", "--study-dir", d), "no sweep has finished", "hpt sweep")
    _refused(_hpt("transfer", "--study-dir", tmp_path / "nothing"), "not a study folder")


def test_transfer_when_every_trial_diverged(tmp_path):
    d = _study_dir(tmp_path)
    pd.DataFrame(
        {
            "width": [16, 16, 32, 32],
            "lr": [0.003, 0.03] * 2,
            "seed": 0,
            "val_loss": float("nan"),
            "status": "diverged",
            "trial_id": list("abcd"),
        }
    ).to_csv(d / "sweep_results.csv", index=False)
    _refused(_hpt("transfer", "--study-dir", d), "no trial has status ok", "lower the LR grid")


def test_resume_with_a_plan_for_another_model(tmp_path):
    from hptransfer.plan import TargetShape, TransferPlan, save_plan

    spec = parse_spec(tiny_spec_dict())
    plan = TransferPlan(
        study="tiny",
        rule="mup",
        model=spec.model,
        base_width=16,
        target=TargetShape(width=64, steps=4, batch_size=8, seq_len=16),
        hyperparameters={"lr": 0.01},
        data=spec.data,
        train=spec.train,
    )
    study = Study(None, tmp_path, name="tiny")
    save_plan(plan.model_copy(update={"target": plan.target.model_copy(update={"width": 128})}), study.paths.train.plan)
    study.paths.train.ray_experiment.mkdir(parents=True)  # a checkpointed run of the 128-wide model
    path = save_plan(plan, tmp_path / "plan.yaml")
    _refused(_hpt("train", path, "--resume"), "cannot resume", "target.width: checkpoint has 128, plan has 64")


@pytest.mark.slow  # five `hpt` processes: ~15 s on 2 cores
def test_bad_plan_and_bad_spec_name_every_problem(tmp_path):
    bad = tmp_path / "plan.yaml"
    bad.write_text(yaml.safe_dump({"study": "x", "rule": "mup", "hyperparamters": {"lr": 0.1}}))
    _refused(_hpt("train", bad), "hyperparamters", "unknown key", "target")
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict(name="[/red]", sweep={"grid": {"lr": [0.1, 0.1]}})))
    for verb in ("validate", "sweep", "run", "coord-check"):
        _refused(_hpt(verb, spec), "[/red]", "repeats values")


@pytest.mark.slow
def test_run_when_every_trial_diverges(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict(name="diverge", sweep={"grid": {"lr": [1e30, 1e31]}, "steps": 3})))
    _refused(_hpt("run", spec, "--study-dir", tmp_path / "st", "--skip-coord-check", timeout=600), "no trial has status ok")


# --- the Python API, and one tracking store for every stage ----------------------------------------


@pytest.mark.slow
def test_python_api_every_stage_logs_to_the_resolved_store(ray_local, tmp_path, monkeypatch):
    import mlflow

    store = f"sqlite:///{tmp_path / 'env.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    spec = tmp_path / "api.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict(name="api", target={"width": 64, "steps": 4, "batch_size": 8})))
    study = Study.from_spec(spec, tmp_path / "study")
    assert study.tracking_uri == store
    cc = study.coord_check()
    assert cc.passed and Path(cc.files["data"]).is_file()
    with study.ray_session():  # one Ray for the sweep and the large run
        df = study.sweep()
        assert isinstance(df, pd.DataFrame) and len(df) == 6 and set(df.status) <= {"ok", "diverged"}
        plan = study.transfer()
        assert plan.target.width == 64 and study.paths.plan.is_file()
        metrics = study.train()
    assert metrics["status"] == "ok" and metrics["step"] == 4
    assert json.loads(study.paths.train.metrics.read_text())["final"]["step"] == 4
    assert study.report().is_file()
    assert not study.paths.mlflow_db.exists()  # nothing went to the default store
    runs = mlflow.MlflowClient(store).search_runs(
        [mlflow.MlflowClient(store).get_experiment_by_name("api").experiment_id], max_results=100
    )
    kinds = sorted(r.data.tags.get("hpt.kind") for r in runs)
    assert kinds == ["sweep", "train"] + ["trial"] * 6
