"""Proposers: priors on what each knob setting does, and candidate source patches.

``ExpertProposer`` works offline from rules and the bank; ``LLMProposer`` asks a locally served
vLLM model (OpenAI-compatible API, JSON-schema output) and falls back to the expert on any
failure. Both implement :class:`Proposer`: ``priors(context)`` and ``patches(context)``.
"""

from __future__ import annotations

from infrarsi.proposers._llm_client import (
    ChatClient,
    ChatResult,
    LLMBadResponse,
    LLMBudgetExceeded,
    LLMError,
    LLMHTTPError,
    LLMTimeout,
    LLMTruncated,
    LLMUnavailable,
)
from infrarsi.proposers._llm_prompt import PATCHES_SCHEMA, PRIORS_SCHEMA, REVISION_SCHEMA
from infrarsi.proposers.base import Context, Proposer, ProposerContext, editable_source
from infrarsi.proposers.expert import RULES, ExpertProposer, bank_patches
from infrarsi.proposers.llm import LLMProposer

__all__ = [
    "PATCHES_SCHEMA",
    "PRIORS_SCHEMA",
    "REVISION_SCHEMA",
    "RULES",
    "ChatClient",
    "ChatResult",
    "Context",
    "ExpertProposer",
    "LLMBadResponse",
    "LLMBudgetExceeded",
    "LLMError",
    "LLMHTTPError",
    "LLMProposer",
    "LLMTimeout",
    "LLMTruncated",
    "LLMUnavailable",
    "Proposer",
    "ProposerContext",
    "bank_patches",
    "editable_source",
]
