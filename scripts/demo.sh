#!/usr/bin/env bash
# Set up, then run the whole pipeline end to end on the embedded default: local Ray on this CPU,
# the cpu_dense reference workload, the SQLite experience bank, no LLM.
# Usage: bash scripts/demo.sh [TASK.yaml or built-in task name] [BUDGET]
# The bank and the run folder go to $INFRARSI_HOME (default here: .infrarsi/ in the checkout).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TASK=${1:-cpu_dense}
BUDGET=${2:-12}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
export INFRARSI_HOME=${INFRARSI_HOME:-$PWD/.infrarsi}
INFRARSI=.venv/bin/infrarsi
NAME=$(.venv/bin/python -c "import sys; from infrarsi.contract import load_task; print(load_task(sys.argv[1]).name)" "$TASK")
RUN_DIR=$INFRARSI_HOME/runs/$NAME
echo "== init: lock the contract of $TASK"
$INFRARSI init "$TASK" --run-dir "$RUN_DIR"
echo "== doctor: profile the baseline and measure the noise floor"
$INFRARSI doctor --run-dir "$RUN_DIR"
echo "== run: search $BUDGET trials, verify the best against the baseline"
$INFRARSI run --run-dir "$RUN_DIR" --budget "$BUDGET"
echo "== report"
$INFRARSI report --run-dir "$RUN_DIR"
