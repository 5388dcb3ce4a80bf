"""Optional: serve the proposer's model with Ray Serve's LLM API on the cluster's GPUs.

Run with the vLLM venv's Python (it needs ``ray[serve,llm]`` and vLLM, never the InfraRSI
install's CPU torch):

    $HOME/.venvs/infrarsi-vllm/bin/pip install "ray[serve,llm]"
    $HOME/.venvs/infrarsi-vllm/bin/python cluster/vllm/serve_ray.py --model Qwen/Qwen2.5-Coder-7B-Instruct

It exposes the same OpenAI-compatible API at http://<head>:8000/v1 (the task spec's
``llm.base_url``); the model id to put in ``llm.model`` is ``--name`` (default: the model).
"""

from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-Coder-7B-Instruct")
    ap.add_argument("--name", default=None, help="model id clients use (default: --model)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel GPUs per replica")
    ap.add_argument("--replicas", type=int, default=1)
    ap.add_argument("--max-model-len", type=int, default=32768)
    args = ap.parse_args()

    from ray import serve
    from ray.serve.llm import LLMConfig, build_openai_app

    config = LLMConfig(
        model_loading_config={"model_id": args.name or args.model, "model_source": args.model},
        deployment_config={"autoscaling_config": {"min_replicas": args.replicas,
                                                  "max_replicas": args.replicas}},
        engine_kwargs={"tensor_parallel_size": args.tp, "max_model_len": args.max_model_len},
    )
    serve.run(build_openai_app({"llm_configs": [config]}), blocking=True)


if __name__ == "__main__":
    main()
