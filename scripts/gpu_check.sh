#!/usr/bin/env bash
# GPU check (one CUDA GPU): the gpu_dense reference workload as real Ray Train trials on nccl.
#   1. `infrarsi init` locks the contract: one baseline trial (fp32, micro-batch 1), loss reference
#   2. a faster setting (bf16, micro-batch 4, selective checkpointing) as one more trial
#   3. a setting that really runs out of memory (micro-batch $OOM_MBS, default 16, no checkpointing, fp32):
#      it must come back as status oom (torch.OutOfMemoryError), censored at the capacity
#   4. `infrarsi doctor --repeats 1`: phase profile and MFU against the task's peak_flops
#   5. with RUN_BUDGET=N: `infrarsi run --budget N --verify-top 1 --pairs 2` (a short search on
#      the GPU, the best config re-measured against the baseline), then `infrarsi report`
#   6. with 2+ GPUs (LAYOUT_GPUS=2 by default): the same task on 2 ranks, baseline data parallel,
#      then tensor parallel (tp=2, with and without sequence parallelism) and pipeline parallel
#      (pp=2, each schedule) trials; each must come back ok (the contract's loss check passed)
# Prints every record; exits non-zero when a step does not behave as stated.
# Usage: bash scripts/gpu_check.sh            (needs nvidia-smi and a CUDA torch)
#        TASK=configs/tasks/other.yaml RUN_BUDGET=3 bash scripts/gpu_check.sh
# Setup: a venv with a CUDA build of torch (the CPU setup never installs one), then
#        pip install -e '.[dev]'. Set PYTHON_BIN to that venv's python (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON_BIN:-.venv/bin/python}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
RUN_DIR=${RUN_DIR:-runs/gpu_check}
TASK=${TASK:-configs/tasks/gpu_dense.yaml}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; assert torch.cuda.is_available(), 'this torch has no CUDA'; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
INFRARSI=("$PY" -m infrarsi.cli)

echo "== 1. init (baseline trial on nccl)"
"${INFRARSI[@]}" init "$TASK" --run-dir "$RUN_DIR"

echo "== 2. a faster setting"
"${INFRARSI[@]}" trial "$TASK" --run-dir "$RUN_DIR" \
  --set precision=bf16 --set micro_batch_size=4 --set activation_checkpointing=selective || true

echo "== 3. a setting that must run out of memory"
set +e
"${INFRARSI[@]}" trial "$TASK" --run-dir "$RUN_DIR" --json \
  --set micro_batch_size="${OOM_MBS:-16}" --set activation_checkpointing=none --set precision=fp32 > "$RUN_DIR/oom.json"
set -e
"$PY" - "$RUN_DIR/oom.json" <<'EOF'
import json, sys
rec = json.load(open(sys.argv[1]))
print(f"status={rec['status']} error_kind={rec.get('error_kind')} "
      f"memory_observation={rec.get('peak_memory_bytes')}")
assert rec["status"] == "oom", f"expected oom, got {rec['status']}: {rec.get('error_message')}"
print("OOM classified as oom (right-censored at the capacity)")
EOF

echo "== 4. doctor: profile and MFU"
"${INFRARSI[@]}" doctor --run-dir "$RUN_DIR" --repeats 1 --pairs 2

if [ -n "${RUN_BUDGET:-}" ]; then
  echo "== 5. a short search on the GPU, the best verified against the baseline"
  "${INFRARSI[@]}" run --run-dir "$RUN_DIR" --budget "$RUN_BUDGET" --verify-top 1 --pairs 2
  "${INFRARSI[@]}" report --run-dir "$RUN_DIR"
fi

NGPU=$(nvidia-smi -L | wc -l)
if [ "$NGPU" -ge "${LAYOUT_GPUS:-2}" ]; then
  echo "== 6. parallel layouts on ${LAYOUT_GPUS:-2} GPUs (tensor, sequence, pipeline)"
  LAYOUT_DIR="$RUN_DIR/layouts"
  mkdir -p "$LAYOUT_DIR"
  # The task with max_workers raised (absolute workspace path: the copy lives in the run dir).
  "$PY" - "$TASK" "$LAYOUT_DIR/task.yaml" "${LAYOUT_GPUS:-2}" <<'EOF'
import sys, yaml
from infrarsi.contract import load_task
spec = load_task(sys.argv[1])
d = spec.to_dict()
d["workload"]["workspace"] = str(spec.workspace_path())
d["hardware"]["max_workers"] = int(sys.argv[3])
d["search"]["baseline"]["num_workers"] = int(sys.argv[3])
for key in ("run_dir", "base_dir"):
    d.pop(key, None)
yaml.safe_dump(d, open(sys.argv[2], "w"), sort_keys=False)
EOF
  "${INFRARSI[@]}" init "$LAYOUT_DIR/task.yaml" --run-dir "$LAYOUT_DIR"
  for layout in "tensor_parallel_degree=2" \
                "tensor_parallel_degree=2 sequence_parallel=true" \
                "pipeline_parallel_degree=2 pipeline_schedule=gpipe" \
                "pipeline_parallel_degree=2 pipeline_schedule=1f1b" \
                "pipeline_parallel_degree=2 pipeline_schedule=interleaved_1f1b"; do
    sets=()
    for kv in $layout; do sets+=(--set "$kv"); done
    echo "-- $layout"
    "${INFRARSI[@]}" trial "$LAYOUT_DIR/task.yaml" --run-dir "$LAYOUT_DIR" "${sets[@]}"
  done
fi
