"""Nothing shipped by surprise: what a Ray Jobs submission of the project would upload, listed by
Ray's own packaging code (`ray._private.runtime_env.packaging.create_package`, the function the
Jobs SDK's upload calls) on a copy of the project with decoys planted where people keep them.

Each exclusion layer is checked on its own as well as together: the runtime_env `excludes` must
hold with Ray's defaults switched off and `.gitignore` ignored (both are environment settings a
user may have), and `.rayignore` must hold for a plain `ray job submit --working-dir .`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hptransfer.deploy import ray_jobs

REPO = Path(__file__).resolve().parents[1]

# Where secrets, databases, environments and outputs end up in a project folder, by category.
DECOYS = {
    "secret": [
        ".env",
        ".env.production",
        "search_spaces/.env",
        "deploy.pem",
        "keys/server.key",
        "certs/client.p12",
        ".ray/auth_token",
        "auth_token",
        "ray.token",
        ".netrc",
        ".pypirc",
        ".git-credentials",
        "id_rsa",
        "id_ed25519.pub",
        ".ssh/config",
        ".aws/credentials",
        ".kube/config",
        "kubeconfig",
        ".docker/config.json",
        "platform/hptransfer/.env",
        "platform/hptransfer/secret.pem",
    ],
    "vcs": [".git/config", ".git/objects/ab/cdef"],
    "database": [
        "mlflow.db",
        "optuna.sqlite3",
        "cache.sqlite",
        "mlruns/0/meta.yaml",
        "mlartifacts/1/a.bin",
        "platform/hptransfer/mlflow.db",
    ],
    "environment": [
        ".venv/bin/python",
        ".venv/lib/python3.11/site-packages/torch/__init__.py",
        "venv/lib/x.py",
        ".tox/py311/x",
        ".nox/x",
    ],
    "cache": [
        ".cache/huggingface/x",
        "__pycache__/a.cpython-311.pyc",
        "platform/hptransfer/__pycache__/spec.pyc",
        "stray.pyc",
        ".pytest_cache/v/x",
        ".ruff_cache/x",
        ".mypy_cache/x",
        ".hypothesis/x",
        "hptransfer.egg-info/PKG-INFO",
        "build/lib/x.py",
        "dist/x.whl",
    ],
    "study": [
        "studies/quickstart/mlflow.db",
        "studies/quickstart/sweep_results.csv",
        "studies/quickstart/train/checkpoint/model.pt",
        "runs/x/ckpt.pt",
        "ray_results/exp/result.json",
        "search_spaces/studies/old/spec.yaml",
    ],
}
# What a job needs: the spec, the project metadata, the package source, the launchers.
NEEDED = [
    "pyproject.toml",
    "search_spaces/quickstart.yaml",
    "launchers/ray_cluster.py",
    "platform/hptransfer/spec/study.py",
    "platform/hptransfer/deploy/render.py",
]


def _project(root: Path, *, rayignore: bool = True, gitignore: bool = True) -> Path:
    """A copy of this project (package, specs, launchers, ignore files) with every decoy planted."""
    root.mkdir()
    for name in ("pyproject.toml", "README.md") + ((".rayignore",) if rayignore else ()) + ((".gitignore",) if gitignore else ()):
        shutil.copy(REPO / name, root / name)
    for folder in ("search_spaces", "launchers", "platform/hptransfer"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for path in (p for paths in DECOYS.values() for p in paths):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text("DECOY\n")
    return root


def _uploaded(project: Path, excludes: list[str] | None = None) -> tuple[set[str], set[str]]:
    """(files in the working_dir zip, files in the py_module zip) as Ray would build them."""
    env = ray_jobs.runtime_env(project)
    if excludes is not None:
        env["excludes"] = excludes
    listing = ray_jobs.upload_listing(env)
    assert set(listing) == {str(project), str(project / "platform" / "hptransfer")}, listing.keys()
    return set(listing[str(project)]), set(listing[str(project / "platform" / "hptransfer")])


def _leaks(working_dir: set[str], module: set[str]) -> list[str]:
    """Decoys present in either upload (module paths are `hptransfer/...` inside its zip)."""
    shipped = working_dir | {"platform/" + m for m in module}
    return sorted(p for paths in DECOYS.values() for p in paths if p in shipped)


def _assert_sources_present(project: Path, working_dir: set[str], module: set[str]) -> None:
    missing = [p for p in NEEDED if p not in working_dir]
    assert not missing, f"needed files not uploaded: {missing}"
    sources = {p.relative_to(project / "platform").as_posix() for p in (project / "platform/hptransfer").rglob("*.py")}
    assert sources and sources <= module, f"package source missing from py_modules: {sorted(sources - module)}"
    assert all(s in working_dir for s in ("platform/" + m for m in sources))


def test_decoys_are_planted_where_ray_would_otherwise_ship_them(tmp_path: Path, monkeypatch) -> None:
    """The check can fail: with no exclusion layer at all Ray's packager ships every decoy."""
    monkeypatch.setenv("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", "")
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    project = _project(tmp_path / "p", rayignore=False)
    working_dir, module = _uploaded(project, excludes=[])
    assert len(_leaks(working_dir, module)) == sum(len(v) for v in DECOYS.values())


def test_upload_as_ray_builds_it_ships_sources_and_no_decoy(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", raising=False)
    monkeypatch.delenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", raising=False)
    project = _project(tmp_path / "p")
    working_dir, module = _uploaded(project)
    assert not _leaks(working_dir, module), _leaks(working_dir, module)
    _assert_sources_present(project, working_dir, module)


def test_runtime_env_excludes_alone_keep_every_decoy_out(tmp_path: Path, monkeypatch) -> None:
    """Ray's defaults off, .gitignore ignored, no .rayignore: the explicit list must suffice."""
    monkeypatch.setenv("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", "")
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    project = _project(tmp_path / "p", rayignore=False, gitignore=False)
    working_dir, module = _uploaded(project)
    assert not _leaks(working_dir, module), _leaks(working_dir, module)
    _assert_sources_present(project, working_dir, module)


def test_rayignore_alone_keeps_every_decoy_out_of_the_working_dir(tmp_path: Path, monkeypatch) -> None:
    """A plain `ray job submit --working-dir .` (no excludes, Ray defaults off, .gitignore ignored)."""
    monkeypatch.setenv("RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES", "")
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    project = _project(tmp_path / "p", gitignore=False)
    working_dir, _ = _uploaded(project, excludes=[])
    assert not _leaks(working_dir, set()), _leaks(working_dir, set())
    _assert_sources_present(project, working_dir, {p.removeprefix("platform/") for p in working_dir})


def test_rayignore_holds_the_same_patterns_as_the_runtime_env() -> None:
    lines = [ln.strip() for ln in (REPO / ".rayignore").read_text().splitlines()]
    patterns = [ln for ln in lines if ln and not ln.startswith("#")]
    assert patterns == ray_jobs.DEFAULT_EXCLUDES, (
        "regenerate .rayignore from ray_jobs.DEFAULT_EXCLUDES (same patterns, same order)"
    )
    assert ray_jobs.runtime_env(REPO)["excludes"][: len(patterns)] == patterns


@pytest.mark.parametrize("category", sorted(DECOYS))
def test_each_category_is_named_in_the_exclude_list(category: str) -> None:
    """One representative pattern per category, so a pruned list fails by name."""
    needed = {
        "secret": {".env", "*.pem", "*.key", ".ray/", "auth_token"},
        "vcs": {".git/"},
        "database": {"*.db", "mlruns/"},
        "environment": {".venv/", "venv/"},
        "cache": {"__pycache__/", ".cache/"},
        "study": {"studies/", "runs/"},
    }[category]
    assert needed <= set(ray_jobs.DEFAULT_EXCLUDES), needed - set(ray_jobs.DEFAULT_EXCLUDES)


def test_launcher_lists_the_upload_without_submitting(tmp_path: Path) -> None:
    import subprocess
    import sys

    project = _project(tmp_path / "p")
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "launchers" / "ray_cluster.py"),
            str(project / "search_spaces" / "quickstart.yaml"),
            "--working-dir",
            str(project),
            "--list-upload",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    listed = set(r.stdout.split())
    assert "search_spaces/quickstart.yaml" in listed and "hptransfer/spec/study.py" in listed
    assert not listed & {p for paths in DECOYS.values() for p in paths}
