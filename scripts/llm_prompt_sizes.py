"""Print the LLM proposer's prompt sizes (characters, ~tokens) for each exchange and workspace.

    .venv/bin/python scripts/llm_prompt_sizes.py

What it tells: the context window a served model needs (cluster/vllm/README.md records it).
Tokens are estimated at 3.5 characters each (code and JSON; the client's budget uses 3).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from _patch_specs import WORKSPACE, tiny_spec  # noqa: E402

from infrarsi.proposers import ExpertProposer, ProposerContext  # noqa: E402
from infrarsi.proposers._llm_prompt import (  # noqa: E402
    patches_messages,
    priors_messages,
    repair_messages,
    revision_messages,
)
from infrarsi.workloads import build_torch_space  # noqa: E402

PLAIN = ROOT / "tests" / "workspaces" / "plain_lm"


class _Verdict:
    rule, reason = "static", "new forbidden construct: torch.manual_seed (reseeds the generator)"


def main() -> None:
    print(f"{'workspace':<12} {'exchange':<10} {'chars':>8} {'~tokens':>8}")
    for name, ws, fam in (("reference", WORKSPACE, "moe"), ("plain_lm", PLAIN, "dense")):
        spec = tiny_spec(fam, ws)
        space = build_torch_space(spec)
        ctx = ProposerContext(space=space, spec=spec)
        priors = ExpertProposer().priors(ctx)
        judged = [{"knob": p.knob, "setting": p.setting, "target": "time",
                   "prior_mean": p.log_time_effect, "prior_std": p.log_time_std,
                   "posterior_mean": 0.0, "posterior_std": 0.05, "evidence_n": 3,
                   "flagged": True} for p in priors if p.log_time_effect is not None]
        patch = (ExpertProposer().patches(ctx) or [None])[0]
        exchanges = {
            "priors": priors_messages(ctx),
            "revision": revision_messages(ProposerContext(space=space, spec=spec,
                                                          revisions=judged), priors),
            "patches": patches_messages(ctx),
            "repair": repair_messages(ctx, [(patch, _Verdict())]) if patch else [],
        }
        for ex, msgs in exchanges.items():
            chars = sum(len(m["content"]) for m in msgs)
            print(f"{name:<12} {ex:<10} {chars:>8} {chars / 3.5:>8.0f}")


if __name__ == "__main__":
    main()
