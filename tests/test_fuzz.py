"""Fuzz suite (Hypothesis): hostile or absurd specs, results tables and plans either work or are
refused with an `HptError` (exit 2 on the CLI) whose problems say where and what — never a
traceback, never a plan or spec holding a non-finite number.

Deterministic (`derandomize=True`), and sized to run in well under a minute on one core."""

from __future__ import annotations

import copy
import itertools
import json
import math
import typing
from functools import cache
from pathlib import Path

import hypothesis
import pandas as pd
import pytest
import tomllib
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from pydantic import BaseModel
from typer.testing import CliRunner

from hptransfer.errors import HptError, PlanError, SpecError
from hptransfer.hyperparameters import TUNABLE
from hptransfer.plan import TransferPlan, parse_plan
from hptransfer.spec import RULE_NAMES, StudySpec, load_spec, parse_spec
from hptransfer.transfer.schedule import warmup_multiplier

from conftest import tiny_spec_dict

FUZZ = {
    "deadline": None,
    "derandomize": True,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
}
RULES = [r for r in RULE_NAMES if r != "dp"]


# --- helpers ---------------------------------------------------------------------------------------


def floats_in(obj, path="") -> typing.Iterator[tuple[str, float]]:
    """Every float in a nested dict/list (a model_dump), with its path."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from floats_in(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from floats_in(v, f"{path}[{i}]")
    elif isinstance(obj, float):
        yield path, obj


def event(what: str) -> None:
    """Count outcomes (pytest --hypothesis-show-statistics) when run by Hypothesis."""
    if currently_in_test_context():
        hypothesis.event(what)


def ints_in(obj, path="") -> typing.Iterator[tuple[str, int]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from ints_in(v, f"{path}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from ints_in(v, f"{path}[{i}]")
    elif isinstance(obj, int) and not isinstance(obj, bool):
        yield path, obj


def assert_finite(obj) -> None:
    bad = [(p, x) for p, x in floats_in(obj) if not math.isfinite(x)]
    assert not bad, f"non-finite values: {bad}"


def assert_problems_say_something(e: HptError) -> None:
    assert e.problems, e
    for p in e.problems:
        assert p.where or p.what, e.problems
    assert "Traceback" not in str(e)


def field_paths(model: type[BaseModel], prefix: tuple = ()) -> list[tuple]:
    """Every field path of a pydantic model, recursing into nested models (also `X | None`)."""
    out = []
    for name, f in model.model_fields.items():
        out.append((*prefix, name))
        for a in typing.get_args(f.annotation) or (f.annotation,):
            if isinstance(a, type) and issubclass(a, BaseModel):
                out += field_paths(a, (*prefix, name))
    return out


def leaf_paths(obj, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += leaf_paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += leaf_paths(v, (*prefix, i))
    return out


def apply(d: dict, op: tuple) -> dict:
    """One mutation: ("set", path, value), ("del", path) or ("extra", path, key, value)."""
    kind, path = op[0], op[1]
    node = d
    for part in path[:-1]:
        if isinstance(node, dict):
            if not isinstance(node.get(part), (dict, list)):
                node[part] = {}
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node) and isinstance(node[part], (dict, list)):
            node = node[part]
        else:
            return d  # the path no longer exists (an earlier mutation replaced it)
    last = path[-1]
    if isinstance(node, list):
        if not (isinstance(last, int) and last < len(node)):
            return d
        if kind == "del":
            node.pop(last)
        elif kind == "set":
            node[last] = op[2]
        return d
    if kind == "set":
        node[last] = op[2]
    elif kind == "del":
        node.pop(last, None)
    elif kind == "extra":
        target = node.setdefault(last, {})
        if isinstance(target, dict):
            target[op[2]] = op[3]
    return d


# --- value strategies --------------------------------------------------------------------------------

ODD_STRINGS = [
    "",
    " ",
    "..",
    ".",
    "/",
    "a/b",
    "../../etc",
    "[/red]",
    "[bold red]x[/]",
    "ünïcødé-名前",
    "x" * 5000,
    "\x00",
    "\n",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e3",
    "-1",
    "0",
    "true",
    "null",
    "mup",
    "dp",
    "llama",
    "lr",
    "ok",
    "OK ",
    "diverged",
    "${HOME}",
    "'; drop table",
    "{a: 1}",
]
SPECIAL_NUMBERS = [
    math.nan,
    math.inf,
    -math.inf,
    0,
    0.0,
    -0.0,
    -1,
    -1.0,
    1,
    1e-300,
    5e-324,
    1e308,
    -1e308,
    2**31,
    2**63,
    2**64 + 1,
    10**30,
    -(10**30),
    1e30,
    0.5,
    0.999999,
    1.0,
    2,
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(SPECIAL_NUMBERS),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(ODD_STRINGS),
    st.text(max_size=12),
)
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
values = st.one_of(
    scalars,
    scalars,
    scalars,
    non_finite,
    st.lists(scalars, max_size=4),
    st.lists(scalars, min_size=1, max_size=3).map(lambda v: v + v[:1]),  # duplicates
    st.just([]),
    st.just({}),
    st.dictionaries(st.one_of(st.sampled_from(sorted(TUNABLE)), st.text(max_size=6)), scalars, max_size=3),
)
unknown_keys = st.one_of(
    st.sampled_from(["wdith", "hyperparamters", "lr", "rule", "", "..", "[/red]", "名前"]),
    st.text(max_size=8),
    st.integers(-3, 3),
)


# --- specs ---------------------------------------------------------------------------------------------

DP_BLOCK = {"epsilon": 8.0, "epochs": 1.0, "dataset_size": 1000}
SPEC_PATHS = sorted(
    set(field_paths(StudySpec))
    | set(leaf_paths(tiny_spec_dict()))
    | {("sweep", "grid", hp) for hp in TUNABLE}
    | {("sweep", "fixed", hp) for hp in TUNABLE}
    | {("sweep", "grid", "lr", i) for i in range(3)}
    | {("sweep", "widths", i) for i in range(2)},
    key=repr,
)
SPEC_CONTAINERS = (
    [()]
    + [p for p in SPEC_PATHS if isinstance(tiny_spec_dict().get(p[0]), dict) and len(p) == 1]
    + [("sweep", "grid"), ("sweep", "fixed"), ("dp",)]
)


# Plausible values too, so that many mutated specs still validate and their values are checked.
plausible = st.one_of(
    st.integers(1, 512), st.floats(1e-4, 10.0), st.sampled_from(["mlp", "llama", "sp", "mup", "fifo", "asha", "tiny-2", "a.b_c"])
)


@st.composite
def spec_ops(draw) -> tuple:
    kind = draw(st.sampled_from(["set", "set", "set", "del", "extra"]))
    if kind == "extra":
        return ("extra", draw(st.sampled_from(SPEC_CONTAINERS)) or ("sweep",), draw(unknown_keys), draw(values))
    path = draw(st.sampled_from(SPEC_PATHS))
    return (kind, path, draw(st.one_of(values, plausible))) if kind == "set" else (kind, path)


@st.composite
def mutated_specs(draw) -> dict:
    d = copy.deepcopy(tiny_spec_dict())
    if draw(st.booleans()):
        d["dp"] = dict(DP_BLOCK)
        if draw(st.booleans()):
            d["transfer"] = {"rule": "dp"}
    for op in draw(st.lists(spec_ops(), min_size=1, max_size=2)):
        d = apply(d, op)
    return d


def check_spec(data) -> StudySpec | None:
    try:
        spec = parse_spec(data)
    except SpecError as e:
        assert_problems_say_something(e)
        event("refused")
        return None
    event("accepted")
    assert_finite(spec.model_dump())
    # Every integer fits the int64 that numpy, torch and Ray hold (seeds, counts, sizes).
    big = [(p, x) for p, x in ints_in(spec.model_dump()) if abs(x) >= 2**63]
    assert not big, f"integers beyond int64: {big}"
    # A spec that validates is usable: a safe folder name, hashes, a bounded trial count.
    assert spec.name not in (".", "..") and "/" not in spec.name and "[" not in spec.name
    assert spec.sweep.n_trials <= spec.sweep.max_trials
    assert spec.target.width >= spec.sweep.widths[-1] > 0
    spec.model_dump_json()
    return spec


@settings(max_examples=250, **FUZZ)
@given(mutated_specs())
def test_fuzz_specs_parse_or_refuse_cleanly(data):
    check_spec(data)


@settings(max_examples=60, **FUZZ)
@given(st.one_of(values, st.lists(values, max_size=2), st.dictionaries(unknown_keys, values, max_size=3)))
def test_fuzz_spec_of_any_shape(data):
    check_spec(data)


EXTREMES = [
    math.nan,
    math.inf,
    -math.inf,
    0,
    -1,
    0.5,
    2**63,
    10**30,
    1e300,
    -1e300,
    "",
    "..",
    "[/red]",
    "x" * 5000,
    None,
    True,
    [],
    {},
    [1, 1],
    [0, -4],
]


def test_every_spec_field_with_every_extreme_value():
    """Exhaustive single mutations (each field path × each extreme value, and each deletion): the
    cases a random search samples only sparsely."""
    failures = []
    for path in SPEC_PATHS:
        base = {**tiny_spec_dict(), **({"dp": dict(DP_BLOCK)} if path[0] == "dp" else {})}
        for op in [("del", path)] + [("set", path, copy.deepcopy(v)) for v in EXTREMES]:
            try:
                check_spec(apply(copy.deepcopy(base), op))
            except Exception as e:  # collect them all: one run lists every field that needs a bound
                failures.append(f"{op[:2]} {repr(op[2:])[:40]}: {type(e).__name__}: {str(e)[:200]}")
    assert not failures, "\n".join(failures)


def _no_traceback(result) -> None:
    out = result.output  # stdout and stderr, interleaved (click ≥ 8.2)
    assert result.exit_code in (0, 2), (result.exit_code, out, repr(result.exception))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in out, out


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


_counter = itertools.count()


@settings(max_examples=8, **FUZZ)
@given(mutated_specs())
def test_fuzz_hpt_validate_exits_0_or_2(fuzz_dir, data):
    from hptransfer.cli import app

    path = fuzz_dir / f"spec{next(_counter)}.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    result = CliRunner().invoke(app, ["validate", str(path)])
    _no_traceback(result)
    event(f"exit {result.exit_code}")
    if result.exit_code == 2:
        assert "error" in result.output
        with pytest.raises(SpecError):  # refused by the CLI: refused by the library too
            load_spec(path)
        return
    # Accepted: the line printed describes the spec the library loads from that file.
    s = load_spec(path)
    said = result.output
    assert said.startswith("ok ") and f"study {s.name!r}, {s.model.family}/{s.model.parametrization}" in said, said
    assert f"{s.sweep.n_trials} trials, rule {s.transfer.rule}" in said and f"target {s.target.width}" in said, said


# --- results tables --------------------------------------------------------------------------------------

WEIRD_CELLS = st.one_of(
    st.sampled_from(SPECIAL_NUMBERS),
    st.sampled_from(ODD_STRINGS),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
)
COLUMNS = ["width", "lr", "seed", "val_loss", "status", "weight_decay", "spec_hash", "trial_id"]


@st.composite
def base_tables(draw) -> pd.DataFrame:
    widths = draw(st.sampled_from([[16, 32], [16, 32, 64], [32, 64, 128]]))
    lrs = draw(st.sampled_from([[0.003, 0.03, 0.3], [1e-3, 3e-3, 1e-2, 3e-2, 1e-1], [0.01, 0.02]]))
    wds = draw(st.sampled_from([None, [0.0, 0.1], [0.01, 0.1, 1.0]]))
    seeds = draw(st.sampled_from([[0], [0, 1]]))
    rows = []
    for w, lr, s, wd in itertools.product(widths, lrs, seeds, wds or [None]):
        loss = 3 + 0.1 * math.log(lr / 0.02) ** 2 + w**-0.5 + 0.001 * s
        row = {"width": w, "lr": lr, "seed": s, "val_loss": loss, "status": "ok"}
        if wd is not None:
            row["weight_decay"] = wd
        rows.append(row)
    return pd.DataFrame(rows)


@st.composite
def table_ops(draw, columns: list) -> tuple:
    kind = draw(st.sampled_from(["cell", "cell", "cell", "column", "drop", "extra", "rows", "dup", "status"]))
    col = draw(st.sampled_from(columns + COLUMNS))
    if kind in ("cell", "column", "extra"):
        return (
            kind,
            col if kind != "extra" else draw(st.one_of(st.sampled_from(ODD_STRINGS[:12]), st.text(max_size=5))),
            draw(st.integers(0, 200)),
            draw(WEIRD_CELLS),
        )
    if kind == "status":
        return (
            kind,
            draw(st.integers(0, 200)),
            draw(st.sampled_from(["ok", "diverged", "failed", "stopped", "OK ", "maybe", "", "nan"])),
        )
    return (kind, col, draw(st.integers(0, 200)))


def apply_table(df: pd.DataFrame, op: tuple) -> pd.DataFrame:
    df = df.copy()
    kind = op[0]
    n = len(df)
    if kind in ("cell", "status"):
        col, i, v = (op[1], op[2], op[3]) if kind == "cell" else ("status", op[1], op[2])
        if n and col in df.columns:
            df[col] = df[col].astype(object)
            df.iloc[i % n, df.columns.get_loc(col)] = v
    elif kind == "column":
        df[op[1]] = [op[3]] * n
    elif kind == "extra":
        df[op[1]] = [op[3] if j % 2 else j for j in range(n)]
    elif kind == "drop":
        df = df.drop(columns=[op[1]], errors="ignore")
    elif kind == "rows":
        df = df.iloc[: op[2] % (n + 1)]
    elif kind == "dup":
        df = pd.concat([df, df.iloc[: op[2] % (n + 1)]])
    return df


@st.composite
def mutated_tables(draw, max_ops: int = 3) -> pd.DataFrame:
    df = draw(base_tables())
    for _ in range(draw(st.integers(0, max_ops))):
        df = apply_table(df, draw(table_ops(list(df.columns))))
    return df


def assert_usable_plan(plan: TransferPlan) -> None:
    dumped = plan.model_dump()
    assert_finite(dumped)
    # Typed fields hold 64-bit integers; the free-form evidence blocks (diagnostics, ...) only need finite numbers.
    typed = plan.model_dump(exclude={"diagnostics", "provenance", "baselines", "heuristics", "dp", "schedule", "axes"})
    big = [(p, x) for p, x in ints_in(typed) if abs(x) >= 2**63]
    assert not big, f"integers beyond int64: {big}"
    assert plan.base_width >= 1 and 0 <= plan.seed < 2**32, (plan.base_width, plan.seed)
    # The trainer's LR factor (sp-warmup) at the first and the last step.
    for step in (0, plan.target.steps):
        assert 0 < warmup_multiplier(step, plan) <= 1


def check_plan(plan: TransferPlan) -> None:
    assert_usable_plan(plan)
    assert all(math.isfinite(v) for v in plan.hyperparameters.values())
    assert plan.hps.lr > 0
    # What `save_plan` writes loads back as the same plan.
    again = parse_plan(yaml.safe_load(yaml.safe_dump(plan.model_dump(mode="json"), allow_unicode=True)))
    assert again.hyperparameters == plan.hyperparameters


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@settings(max_examples=80, **FUZZ)
@given(
    df=mutated_tables(),
    rule=st.sampled_from(RULES),
    target_width=st.sampled_from([0, -8, 16, 64, 128, 1024, 4096, 10**6, 10**12, 10**30, 10**200]),
    base_width=st.sampled_from([None, None, 1, 16, 32, 10**9]),
    family=st.sampled_from(["mlp", "llama"]),
    steps=st.sampled_from([(100, None), (100, 10_000), (1, 10**7), (50, 10**9)]),
    batch=st.sampled_from([(16, None), (16, 512), (1, 10**6)]),
)
def test_fuzz_results_tables_make_a_finite_plan_or_refuse(df, rule, target_width, base_width, family, steps, batch):
    from hptransfer.transfer.engine import make_plan, standalone_spec

    try:
        spec = standalone_spec(
            df,
            rule=rule,
            target_width=target_width,
            base_width=base_width,
            proxy_steps=steps[0],
            target_steps=steps[1],
            proxy_batch_size=batch[0],
            target_batch_size=batch[1],
            model={"family": family},
        )
        plan = make_plan(spec, df)
    except HptError as e:
        assert_problems_say_something(e)
        event(f"refused: {type(e).__name__}")
        return
    event("accepted")
    check_plan(plan)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow on losses like 1e300: expected
def test_every_results_column_with_every_extreme_cell():
    """Exhaustive single-cell and whole-column mutations of a good table, rules taken in turn."""
    from hptransfer.transfer.engine import make_plan, standalone_spec

    rules = itertools.cycle(RULES)
    base = pd.DataFrame(
        [
            {"width": w, "lr": lr, "seed": 0, "val_loss": 3 + 0.1 * math.log(lr / 0.02) ** 2 + w**-0.5, "status": "ok"}
            for w in (16, 32, 64)
            for lr in (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
        ]
    )
    failures = []
    for col in [*base.columns, "weight_decay"]:
        for v in [math.nan, math.inf, -1, 0, 1e300, "[/red]", None]:
            for op in (("cell", col, 7, v),) + ((("column", col, 0, v),) if v in (0, "[/red]") else ()):
                df, rule = apply_table(base, op), next(rules)
                try:
                    try:
                        check_plan(make_plan(standalone_spec(df, rule=rule, target_width=256), df))
                    except HptError as e:
                        assert_problems_say_something(e)
                except Exception as e:
                    failures.append(f"{op[:2]} {repr(v)[:40]} {rule}: {type(e).__name__}: {str(e)[:200]}")
    assert not failures, "\n".join(failures)


@settings(max_examples=6, **FUZZ)
@given(
    df=mutated_tables(max_ops=2),
    rule=st.sampled_from([*RULES, "magic", ""]),
    target_width=st.sampled_from(["256", "4096", "0", "-5", "1e3", "abc", str(10**30)]),
)
def test_fuzz_hpt_transfer_results_exits_0_or_2(fuzz_dir, df, rule, target_width):
    from hptransfer.cli import app

    n = next(_counter)
    df.to_csv(fuzz_dir / f"results{n}.csv", index=False)
    result = CliRunner().invoke(
        app,
        [
            "transfer",
            "--results",
            str(fuzz_dir / f"results{n}.csv"),
            "--rule",
            rule,
            "--target-width",
            target_width,
            "--family",
            "mlp",
            "--out",
            str(fuzz_dir / f"plan{n}.yaml"),
        ],
    )  # and print the diagnostics
    _no_traceback(result)
    event(f"exit {result.exit_code}")
    written = fuzz_dir / f"plan{n}.yaml"
    if result.exit_code == 2:
        assert not written.exists(), "a refused transfer wrote a plan"
        return
    # Exit 0: the plan file on disk loads as a usable plan, for the rule and width asked for.
    plan = parse_plan(yaml.safe_load(written.read_text()))
    check_plan(plan)
    assert plan.rule == rule and plan.target.width == int(float(target_width)), (plan.rule, plan.target.width)
    assert f"plan written to {written}" in " ".join(result.output.split())


def _study(fuzz_dir: Path, table: pd.DataFrame, spec_over: dict):
    from hptransfer.spec import sweep_hash
    from hptransfer.study import Study

    spec = parse_spec(tiny_spec_dict(**spec_over))
    root = fuzz_dir / f"study{next(_counter)}"
    # One MLflow store for all examples: creating a sqlite store per example costs seconds.
    study = Study.from_spec(spec, root, tracking_uri=f"sqlite:///{fuzz_dir}/mlflow.db")
    root.mkdir(parents=True)
    study.paths.spec.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    if "spec_hash" in table.columns:
        table = table.assign(spec_hash=[sweep_hash(spec) if h == "SPEC" else h for h in table["spec_hash"]])
    table.to_csv(study.paths.sweep_results, index=False)
    return study


@settings(max_examples=5, **FUZZ)
@given(
    df=mutated_tables(max_ops=2),
    spec_over=st.sampled_from(
        [
            {},
            {"sweep": {"widths": [16, 32, 64], "grid": {"lr": [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]}}},
            {"transfer": {"rule": "sp-warmup"}},
            {"target": {"width": 4096, "steps": 600}},
        ]
    ),
    tag=st.sampled_from(["SPEC", "SPEC", "0123456789abcdef", None]),
)
def test_fuzz_transfer_stage_on_a_study_folder(fuzz_dir, df, spec_over, tag):
    from hptransfer.pipeline import transfer_stage

    if tag is not None:
        df = df.assign(spec_hash=tag)
    study = _study(fuzz_dir, df, spec_over)
    try:
        plan = transfer_stage(study)
    except HptError as e:
        assert_problems_say_something(e)
        event(f"refused: {type(e).__name__}")
        return
    event("accepted")
    check_plan(plan)
    assert study.paths.plan.is_file()


# --- plans ---------------------------------------------------------------------------------------------


def _minimal_plan() -> dict:
    spec = parse_spec(tiny_spec_dict())
    return {
        "study": "tiny",
        "rule": "mup",
        "model": spec.model.model_dump(),
        "base_width": 16,
        "target": {"width": 64, "steps": 4, "batch_size": 8, "seq_len": 16},
        "hyperparameters": {"lr": 0.01},
        "data": spec.data.model_dump(),
        "train": spec.train.model_dump(),
    }


@cache
def _real_plans() -> tuple[dict, ...]:
    """Plans as `hpt transfer` writes them (diagnostics, schedule, heuristics, baselines, multipliers)."""
    from hptransfer.transfer.engine import make_plan

    out = [_minimal_plan()]
    rows = [
        {"width": w, "lr": lr, "seed": 0, "val_loss": 3 + 0.1 * math.log(lr / 0.02) ** 2 + w**-0.5, "status": "ok"}
        for w in (16, 32, 64)
        for lr in (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)
    ]
    df = pd.DataFrame(rows)
    sweep = {"widths": [16, 32, 64], "grid": {"lr": sorted(df.lr.unique())}}
    for over in (
        {"sweep": sweep},
        {"transfer": {"rule": "sp-warmup"}, "sweep": {**sweep, "fixed": {"weight_decay": 0.1}}},
        {"sweep": sweep, "target": {"width": 256, "steps": 600, "batch_size": 32}},
    ):
        spec = parse_spec(tiny_spec_dict(**over))
        out.append(make_plan(spec, df).model_dump(mode="json"))
    return tuple(out)


PLAN_PATHS = sorted(
    set(field_paths(TransferPlan))
    | {("hyperparameters", hp) for hp in TUNABLE}
    | {("schedule", k) for k in ("kind", "m", "timescale", "base")}
    | {("param_group_multipliers", "hidden_matrices", k) for k in ("lr", "weight_decay")}
    | {("diagnostics", k) for k in ("tuned", "primary", "warnings", "notes", "predicted_penalty")},
    key=repr,
)


@st.composite
def mutated_plans(draw, min_ops: int = 1) -> dict:
    d = copy.deepcopy(draw(st.sampled_from(_real_plans())))
    paths = sorted(set(PLAN_PATHS) | set(leaf_paths(d)), key=repr)
    for _ in range(draw(st.integers(min_ops, 3))):
        kind = draw(st.sampled_from(["set", "set", "set", "del", "extra"]))
        if kind == "extra":
            container = draw(
                st.sampled_from(
                    [
                        (),
                        ("target",),
                        ("model",),
                        ("hyperparameters",),
                        ("schedule",),
                        ("diagnostics",),
                        ("param_group_multipliers",),
                    ]
                )
            )
            d = (
                apply(d, ("extra", container, draw(unknown_keys), draw(values)))
                if container
                else {**d, draw(st.sampled_from(["hyperparamters", "extra", "版本"])): draw(values)}
            )
        else:
            path = draw(st.sampled_from(paths))
            d = apply(d, (kind, path, draw(values)) if kind == "set" else (kind, path))
    return d


@settings(max_examples=250, **FUZZ)
@given(mutated_plans())
def test_fuzz_plans_parse_or_refuse_cleanly(data):
    from hptransfer.transfer.exports import caveats, deepspeed_config, hf_training_args, torchtitan_toml

    try:
        plan = parse_plan(data)
    except PlanError as e:
        assert_problems_say_something(e)
        event("refused")
        return
    event("accepted")
    assert_usable_plan(plan)
    # What every consumer of a loaded plan reads must work on anything that validates.
    assert plan.hps.lr > 0
    caveats(plan)
    assert_finite(deepspeed_config(plan))
    assert_finite(hf_training_args(plan))
    torchtitan_toml(plan)


def test_every_plan_field_with_every_extreme_value():
    from hptransfer.transfer.exports import caveats

    failures = []
    for base in _real_plans()[::2]:  # the minimal plan and an sp-warmup one (schedule, multipliers, diagnostics)
        for path in sorted(set(PLAN_PATHS) | {p for p in leaf_paths(base) if len(p) <= 2}, key=repr):
            for op in [("del", path)] + [("set", path, copy.deepcopy(v)) for v in EXTREMES]:
                try:
                    try:
                        plan = parse_plan(apply(copy.deepcopy(base), op))
                    except PlanError as e:
                        assert_problems_say_something(e)
                        continue
                    assert_usable_plan(plan)
                    caveats(plan)
                except Exception as e:
                    failures.append(f"{op[:2]} {repr(op[2:])[:40]}: {type(e).__name__}: {str(e)[:200]}")
    assert not failures, "\n".join(failures)


@settings(max_examples=4, **FUZZ)
@given(data=mutated_plans(min_ops=0), to=st.sampled_from(["deepspeed", "hf", "torchtitan", "onnx"]))
def test_fuzz_hpt_export_exits_0_or_2(fuzz_dir, data, to):
    from hptransfer.cli import app

    n = next(_counter)
    path = fuzz_dir / f"plan{n}.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    out = fuzz_dir / f"export{n}.out"
    result = CliRunner().invoke(app, ["export", str(path), "--to", to, "--out", str(out)])
    _no_traceback(result)
    event(f"exit {result.exit_code}")
    if result.exit_code == 2:
        assert not out.exists(), "a refused export wrote a file"
        return
    # Exit 0: the file parses in its format and carries the plan's optimizer and shape.
    plan = parse_plan(yaml.safe_load(path.read_text()))
    hps = plan.hps
    if to == "torchtitan":
        t = tomllib.loads(out.read_text())
        got = (t["optimizer"]["lr"], t["optimizer"]["weight_decay"], t["training"]["steps"], t["training"]["max_norm"])
        assert (t["optimizer"]["beta1"], t["optimizer"]["beta2"]) == (hps.beta1, hps.beta2)
    elif to == "hf":
        j = json.loads(out.read_text())
        got = (j["learning_rate"], j["weight_decay"], j["max_steps"], j["max_grad_norm"])
        assert (j["adam_beta1"], j["adam_beta2"], j["warmup_steps"]) == (hps.beta1, hps.beta2, round(hps.warmup_steps))
    else:
        j = json.loads(out.read_text())
        opt = j["optimizer"]["params"]
        got = (opt["lr"], opt["weight_decay"], plan.target.steps, j["gradient_clipping"])
        assert opt["betas"] == [hps.beta1, hps.beta2] and j["train_batch_size"] == plan.target.batch_size
    assert got == (hps.lr, hps.weight_decay, plan.target.steps, hps.grad_clip), (to, got)
