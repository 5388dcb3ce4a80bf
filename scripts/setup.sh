#!/usr/bin/env bash
# Create .venv and install InfraRSI with its test dependencies. Idempotent: a second run is quick.
# On a CPU machine torch comes from the CPU build (torch==2.13.0); never a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q "torch==2.13.0"
fi
if ! .venv/bin/python -c "import infrarsi, ray, lifelines, optuna, pytest" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.infrarsi-installed ]; then
  .venv/bin/pip install -q -e ".[dev]"
  touch .venv/.infrarsi-installed
fi
