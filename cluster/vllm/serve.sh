#!/usr/bin/env bash
# Serve a code-capable instruct model with vLLM's OpenAI-compatible server for InfraRSI's LLM
# proposer. vLLM pins its own CUDA torch, so it lives in its own venv (never in the InfraRSI
# install). Run on the Ray head node or any GPU node the driver can reach.
#
#   cluster/vllm/serve.sh                                  # default model, 127.0.0.1:8000
#   MODEL=Qwen/Qwen2.5-Coder-32B-Instruct TP=2 cluster/vllm/serve.sh
#   HOST=0.0.0.0 INFRARSI_LLM_API_KEY=secret cluster/vllm/serve.sh   # reachable from workers
#
# Then point the task spec at it:
#   llm: {base_url: "http://127.0.0.1:8000/v1", model: "Qwen/Qwen2.5-Coder-7B-Instruct"}
set -euo pipefail

MODEL="${MODEL:-Qwen/Qwen2.5-Coder-7B-Instruct}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"
TP="${TP:-1}"                         # tensor-parallel GPUs for the model
MAX_LEN="${MAX_LEN:-32768}"           # the prompts carry the editable source: keep >= 16k
GPU_UTIL="${GPU_UTIL:-0.85}"
VENV="${VLLM_VENV:-$HOME/.venvs/infrarsi-vllm}"
VLLM_SPEC="${VLLM_SPEC:-vllm>=0.12}"  # >= 0.12: structured_outputs (guided_json was removed)

if [ ! -x "$VENV/bin/vllm" ]; then
  echo "creating $VENV with $VLLM_SPEC (its own CUDA torch) ..." >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --upgrade pip >/dev/null
  "$VENV/bin/pip" install "$VLLM_SPEC"
fi

args=(serve "$MODEL" --host "$HOST" --port "$PORT"
      --tensor-parallel-size "$TP" --max-model-len "$MAX_LEN"
      --gpu-memory-utilization "$GPU_UTIL" --generation-config vllm)
if [ -n "${INFRARSI_LLM_API_KEY:-}" ]; then
  args+=(--api-key "$INFRARSI_LLM_API_KEY")
fi
exec "$VENV/bin/vllm" "${args[@]}" "$@"
