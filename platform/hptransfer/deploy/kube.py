"""kubectl at the edge: build kustomizations, find the current context, apply manifests."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        raise FileNotFoundError("kubectl is not on PATH; install it (https://kubernetes.io/docs/tasks/tools/)")
    return path


def kustomize_build(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR` parsed into objects (raises with kustomize's own message)."""
    proc = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {directory} failed:\n{proc.stderr.strip()}")
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def current_context() -> str | None:
    """The kubeconfig's current context, or None when no cluster is configured."""
    proc = subprocess.run([kubectl(), "config", "current-context"], capture_output=True, text=True, timeout=30)
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def apply(manifest: str, *, dry_run: bool = False) -> int:
    """`kubectl apply -f -` (server-side dry run with `dry_run`); returns kubectl's exit code."""
    cmd = [kubectl(), "apply", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    return subprocess.run(cmd, input=manifest, text=True, timeout=120).returncode
