#!/usr/bin/env bash
# Create .venv with hptransfer and everything its tests need (CPU torch pinned by constraints.txt).
# Idempotent: a second run only checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.hpt-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  python -m pip install -q --upgrade pip
  # uv (pinned in constraints.txt) resolves and downloads in parallel: the install takes ~1.5 min
  # where pip takes 3+ on 2 cores. uv does not read pip's configuration, so the local wheel folders
  # pip is pointed at (here: the CPU torch) are handed to it; if uv cannot be had or fails, pip.
  links=()
  for d in ${PIP_FIND_LINKS:-} $(python -m pip config get global.find-links 2>/dev/null || true); do
    [ -d "$d" ] && links+=(--find-links "$d")
  done
  index=$(python -m pip config get global.index-url 2>/dev/null || true)
  [ -n "${PIP_INDEX_URL:-}" ] && index=$PIP_INDEX_URL
  [ -n "$index" ] && links+=(--index-url "$index")
  install() {  # install ARGS...: with uv, else pip
    if [ -x .venv/bin/uv ] && .venv/bin/uv pip install --python .venv/bin/python "${links[@]}" "$@"; then
      return 0
    fi
    python -m pip install "$@"
  }
  python -m pip install -q -c constraints.txt uv || echo "uv not installable here: installing with pip"
  install -c constraints.txt -e '.[test]'
  # torchtitan declares datasets<4.8 and wandb; what it imports comes with the `handoff` extra above.
  if python -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    install -c constraints.txt --no-deps torchtitan
  fi
  # mup declares torchvision but never imports it; a torchvision that does not match the CPU
  # torch breaks `import transformers` (operator torchvision::nms does not exist).
  python -m pip uninstall -y -q torchvision || true
  # Build once here what the first run would otherwise build or cache on the clock, in the folders
  # hptransfer.env.configure points every process at: DeepSpeed's shared-memory collective op
  # (JIT-compiled by the first deepspeed.initialize on the CPU accelerator, ~27 s) and matplotlib's
  # font cache. The builder returns None where the accelerator has no such op (e.g. CUDA).
  # (In the background, beside the bytecode compile below: one compiler process and one Python.)
  TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$PWD/.venv/torch_extensions}" MPLCONFIGDIR="${MPLCONFIGDIR:-$PWD/.venv/mplconfig}" \
    python -c "
import matplotlib.font_manager
from deepspeed.accelerator import get_accelerator
b = get_accelerator().create_op_builder('ShareMemCommBuilder')
b is None or b.load(verbose=False)
" >/dev/null &
op_build=$!
  # Compile every installed module to bytecode once, here, on all cores. uv does not (pip does), and
  # where PYTHONDONTWRITEBYTECODE=1 is set (as on the CI machines) nothing ever writes a .pyc: each
  # process (the tests start hundreds: hpt, Ray workers, Tune trials, DeepSpeed ranks) would compile
  # torch, transformers, Ray, DeepSpeed and MLflow from source again, ~10 s more per process
  # (measured: their imports 20 s without .pyc files, 10 s with; the compile takes ~45 s on 2 cores).
  # (Some packages ship files for other Python versions: compileall then exits 1; not an install failure.)
  # Packages' own test folders (pandas, sympy, scipy, sklearn, ...: 15% of the files) are never imported
  # by a run and are left out.
  python -m compileall -q -j 0 -x '/tests?/' "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
  wait "$op_build"  # its failure fails the setup, as before (set -e)
  echo "$want" > "$stamp"
fi
python -c "import platform, hptransfer; platform.system()"
