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


def test_no_study_file_name_is_written_outside_study_py():
    """Every study file name lives on StudyPaths/TrainPaths; other modules use those properties."""
    names = {
        Path(getattr(StudyPaths(Path("/s")), a)).name
        for a in dir(StudyPaths)
        if isinstance(getattr(StudyPaths, a, None), property) and a != "train"
    }
    names |= {"train_metrics.json", "deepspeed_config.json", "hf_model", "checkpoints_local", "engine_param_groups.json"}
    names = {n for n in names if "." in n or "_" in n}  # file names, not words like "report" (a verb too)
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name == "study.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno} {node.value!r}")
    assert not offenders, offenders


# --- the import graph ------------------------------------------------------------------------------

CORE = {
    "hptransfer.spec",
    "hptransfer.hyperparameters",
    "hptransfer.study",
    "hptransfer.io",
    "hptransfer.errors",
    "hptransfer.privacy",
    "hptransfer.plan",
    "hptransfer.env",
}
FEATURES = (
    "hptransfer.sweep",
    "hptransfer.transfer",
    "hptransfer.train",
    "hptransfer.dp",
    "hptransfer.models",
    "hptransfer.report",
    "hptransfer.deploy",
    "hptransfer.data",
    "hptransfer.coordcheck",
    "hptransfer.pipeline",
    "hptransfer.cli",
    "hptransfer.tracking",
)


def _module(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PKG / rel).with_suffix(".py").is_file() or (PKG / rel / "__init__.py").is_file()


def _imports(path: Path, module_level: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level else list(ast.walk(tree))
    out = set()
    for node in nodes:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks never run
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hptransfer"):
            subs = {f"{node.module}.{a.name}" for a in node.names}
            sub_modules = {m for m in subs if _is_module(m)}
            out.update(subs)
            if subs - sub_modules:  # `from pkg import submodule` needs the submodule, not pkg's names
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("hptransfer"))
    return out


def test_no_import_cycles_at_module_level():
    modules = {_module(p): p for p in PKG.rglob("*.py")}
    graph = {m: {i for i in _imports(p, True) if i in modules and i != m} for m, p in modules.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, stack: list[str]) -> bool:
        state[m] = 1
        for n in graph[m]:
            if state.get(n) == 1:
                cycle.extend(stack[stack.index(n) :] + [n] if n in stack else [m, n])
                return True
            if not state.get(n) and visit(n, stack + [n]):
                return True
        state[m] = 2
        return False

    assert not any(visit(m, [m]) for m in graph if not state.get(m)), " → ".join(cycle)


def test_the_core_imports_no_feature_package():
    """spec, hyperparameters, study, io, errors, privacy, plan import no feature package at module
    level; inside functions only these, each for a stated reason:
    - study → pipeline, tracking: `Study`'s notebook methods and its tracker factory;
    - spec → models.families, data.tokenizer: validating a `hf` config against the width table and a
      tokenizer folder needs them (transformers is imported only then)."""
    allowed = {
        "hptransfer.study": ("hptransfer.pipeline", "hptransfer.tracking"),
        "hptransfer.spec": ("hptransfer.models.families", "hptransfer.data.tokenizer"),
    }
    for m in CORE:
        path = PKG / (m.split(".", 1)[1].replace(".", "/") + ".py")
        top = {i for i in _imports(path, module_level=True) if i.startswith(FEATURES)}
        assert not top, f"{m} imports {sorted(top)} at module level"
        lazy = {i for i in _imports(path, module_level=False) if i.startswith(FEATURES)}
        bad = {i for i in lazy if not i.startswith(allowed.get(m, ("-",)))}
        assert not bad, f"{m} imports {sorted(bad)}"


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
def test_python_api_every_stage_logs_to_the_resolved_store(tmp_path, monkeypatch):
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
