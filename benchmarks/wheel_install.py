"""A package a user installs (issue 39, item 4): the wheel into a clean virtual environment that
already has the user's torch, then `hpt run` there, without scripts/setup.sh.

Steps, each timed (wall seconds, this machine):
  1. `python -m pip wheel --no-deps .` → dist/hptransfer-*.whl (setuptools, build isolation);
  2. a fresh `python -m venv`, then the user's torch into it (here the CPU build, `torch==2.13.0`
     from the local wheel folder pip is configured with): not counted as our install;
  3. `pip install <wheel>` with no constraints file: the install time a user sees;
  4. checks: torch is the one the user had (no dependency replaced it), `hpt --help` works, and
     `hpt run` of tests' tiny end-to-end spec (coord check, 6-trial sweep, transfer, a 10-step
     DeepSpeed large run on 2 Ray Train workers, report) finishes with exit 0 from a folder outside
     the repository (no file of the checkout on its path), DeepSpeed's CPU op JIT-built on first use.
The venv is left at --venv for a look; `--pip uv` uses uv (faster, the same resolution rules).

Run: .venv/bin/python benchmarks/wheel_install.py → benchmarks/results/wheel_install.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, ROOT, machine_info

USER_TORCH = "torch==2.13.0"


def _run(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return round(time.perf_counter() - t, 1), p


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", type=Path, default=Path("/tmp/hpt_wheel_venv"))
    ap.add_argument("--pip", choices=("pip", "uv"), default="pip")
    ap.add_argument(
        "--keep-torch",
        action="store_true",
        help="install as the README says: the user's torch version named in the same pip command (else pip may upgrade it)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "wheel_install.json")
    ap.add_argument("--check", action="store_true", help="exit 1 unless it works (the CI step: .ci/run)")
    ap.add_argument(
        "--compile-bytecode",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="uv: write the .pyc files at install, as pip does (default); --no-compile-bytecode: as uv does by default",
    )
    args = ap.parse_args(argv)
    import yaml

    from hptransfer.io import write_json

    out: dict = {
        "machine": machine_info(),
        "command": f".venv/bin/python benchmarks/wheel_install.py --pip {args.pip}"
        + (" --keep-torch" if args.keep_torch else ""),
    }
    dist = Path("/tmp/hpt_wheel_dist")
    shutil.rmtree(dist, ignore_errors=True)
    out["build_s"], p = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)])
    wheels = sorted(dist.glob("hptransfer-*.whl"))
    if p.returncode or not wheels:
        raise SystemExit(f"wheel build failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    out["wheel"] = wheels[0].name
    shutil.rmtree(args.venv, ignore_errors=True)
    py = args.venv / "bin" / "python"
    out["venv_s"], _ = _run([sys.executable, "-m", "venv", str(args.venv)])
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}

    def pip(*a: str, tool: str = args.pip):
        if tool == "uv":  # uv does not read pip's configuration: the local wheel folders pip is pointed at
            links = [x for d in uv_find_links() for x in ("--find-links", d)]
            # --compile-bytecode: pip writes every module's .pyc at install; uv does not unless asked, and
            # where PYTHONDONTWRITEBYTECODE=1 (the CI machines) every process would compile them again.
            compile_ = ["--compile-bytecode"] if args.compile_bytecode else []
            return _run(
                [str(ROOT / ".venv" / "bin" / "uv"), "pip", "install", "--python", str(py), *compile_, *links, *a], env=env
            )
        return _run([str(py), "-m", "pip", "install", "-q", *a], env=env)

    # The user's torch as the user has it (pip and its configuration: here the local CPU build).
    # With --pip uv the user's torch is put there by uv too (from its cache: seconds, where pip takes 20-30 s
    # on 2 cores), named with its local tag as below; the check is what the wheel's install does to it.
    user_torch = USER_TORCH if args.pip == "pip" else f"torch=={importlib.metadata.version('torch')}"
    out["user_torch_s"], p = pip(user_torch)
    if p.returncode:
        raise SystemExit(f"installing the user's torch failed:\n{p.stderr[-2000:]}")
    torch_before = subprocess.run(
        [str(py), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    # The version named as the user's pip shows it (uv: with its local tag, +cpu here; else uv may pick
    # another build of the same version from an index).
    keep = [f"torch=={torch_before if args.pip == 'uv' else torch_before.split('+')[0]}"] if args.keep_torch else []
    out["install_command"] = " ".join(["pip install", wheels[0].name, *keep])
    out["compile_bytecode"] = args.pip == "uv" and args.compile_bytecode
    out["install_s"], p = pip(str(wheels[0]), *keep)
    out["install_ok"] = p.returncode == 0
    if p.returncode:
        out["install_error"] = (p.stdout + p.stderr)[-3000:]
    torch_after = subprocess.run(
        [str(py), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    out["torch"] = {"before": torch_before, "after": torch_after, "kept": torch_before == torch_after}
    hpt = args.venv / "bin" / "hpt"
    _, p = _run([str(py), "-c", "import torchvision"], env=env)
    out["torchvision_imports"] = p.returncode == 0  # False: a broken one, which hptransfer hides (hptransfer/__init__.py)
    _, p = _run([str(hpt), "--help"], env=env)
    out["help_ok"] = p.returncode == 0 and "Usage" in p.stdout

    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import e2e_spec_dict

    work = Path("/tmp/hpt_wheel_work")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    (work / "spec.yaml").write_text(yaml.safe_dump(e2e_spec_dict()))
    out["run_s"], p = _run([str(hpt), "run", "spec.yaml", "--study-dir", "study"], cwd=work, env=env, timeout=1200)
    out["run_ok"] = p.returncode == 0 and "study done" in p.stdout
    out["run_tail"] = p.stdout[-1500:] + p.stderr[-1500:]
    out["verdict"] = (
        "works"
        if out["install_ok"] and out["torch"]["kept"] and out["help_ok"] and out["run_ok"]
        else "does not work: see install_error / torch / run_tail"
    )
    write_json(args.out, out)
    print({k: v for k, v in out.items() if k not in ("run_tail", "install_error", "machine")})
    if args.check and out["verdict"] != "works":
        print(out.get("install_error", "") + out["run_tail"], file=sys.stderr)
        raise SystemExit(f"wheel install check failed: {out['verdict']}")
    return out


def uv_find_links() -> list[str]:
    """The local wheel folders pip is configured with (PIP_FIND_LINKS, pip's global.find-links)."""
    found = os.environ.get("PIP_FIND_LINKS", "").split()
    p = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True)
    found += p.stdout.split() if p.returncode == 0 else []
    return [d for d in dict.fromkeys(found) if os.path.isdir(d)]


if __name__ == "__main__":
    main()
