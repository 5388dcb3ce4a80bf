#!/usr/bin/env bash
# Each shipped user-job example as a user runs it, from the command line: a copy of the example
# made a git repository, a fresh INFRARSI_HOME, then init -> doctor -> run -> report (and apply
# when something was promoted). Prints each stage's wall time and the run's verdict lines, and
# the glue line counts (adapter + YAML, non-blank non-comment lines).
#
#   bash scripts/examples_cli.sh [BUDGET] [EXAMPLE ...]     # default: 4, all three examples
#
# Extra flags for `infrarsi run` go in $RUN_FLAGS (default: --verify-top 1).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${INFRARSI_BIN:-$ROOT/.venv/bin/infrarsi}"
PY="$(dirname "$BIN")/python"
BUDGET="${1:-4}"
shift || true
EXAMPLES=("$@")
[ ${#EXAMPLES[@]} -gt 0 ] || EXAMPLES=(nanogpt nanogpt_loop hf_causal_lm)
RUN_FLAGS="${RUN_FLAGS:---verify-top 1}"

"$PY" "$ROOT/scripts/example_glue.py" "${EXAMPLES[@]}"

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for ex in "${EXAMPLES[@]}"; do
  repo="$WORK/$ex"
  cp -r "$ROOT/examples/$ex" "$repo"
  rm -rf "$repo/__pycache__"
  git -C "$repo" init -q
  git -C "$repo" add -A
  git -C "$repo" -c user.email=user@example.com -c user.name=user commit -qm "my training job"
  export INFRARSI_HOME="$WORK/home-$ex"
  log="$WORK/$ex.log"
  start=$(date +%s)
  stage() {  # stage NAME CMD...: run it in the repo, keep its output, time it
    local name=$1 t0 rc=0
    shift
    t0=$(date +%s)
    (cd "$repo" && "$@") >>"$log" 2>&1 || rc=$?
    echo "$ex: $name exit $rc in $(( $(date +%s) - t0 )) s"
    return $rc
  }
  ok=1
  stage init "$BIN" init infrarsi.yaml && stage doctor "$BIN" doctor \
    && stage run "$BIN" run --budget "$BUDGET" $RUN_FLAGS && stage report "$BIN" report || ok=0
  if [ $ok = 1 ] && grep -q "^promoted: [0-9]" "$log"; then
    stage apply "$BIN" apply || true
  fi
  echo "$ex: total $(( $(date +%s) - start )) s"
  grep -E "verdict|promot|pair [0-9]|trials:|baseline:|work per step|parameters|Error|error:" "$log" | tail -n 30 \
    | sed "s/^/  $ex | /" || true
  [ $ok = 1 ] || { echo "$ex: FAILED; full log:"; cat "$log"; }
done
