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
  python -m pip install -c constraints.txt -e '.[test]'
  # mup declares torchvision but never imports it; a torchvision that does not match the CPU
  # torch breaks `import transformers` (operator torchvision::nms does not exist).
  python -m pip uninstall -y -q torchvision || true
  echo "$want" > "$stamp"
fi
python -c "import platform, hptransfer; platform.system()"
