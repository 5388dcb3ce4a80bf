"""The LLM proposer: priors and patches from a locally served model, the expert as its net.

Every exchange (prompt, answer, or the error) is kept in the bank for audit when a bank and a
run id are in the context. Anything that goes wrong — endpoint down or slow, an HTTP error, a
truncated answer, malformed JSON, a schema-valid answer full of nonsense — is logged, counted in
:attr:`LLMProposer.stats`, and the caller gets the expert proposer's answer instead (for priors,
valid LLM priors override the expert's for the same setting; the expert fills the rest).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any

from infrarsi.models.priors import KnobPrior
from infrarsi.patches import Patch
from infrarsi.proposers._llm_client import ChatClient, LLMError
from infrarsi.proposers._llm_prompt import (
    PATCHES_SCHEMA,
    PRIORS_SCHEMA,
    REVISION_SCHEMA,
    patches_messages,
    priors_messages,
    repair_messages,
    revision_messages,
)
from infrarsi.proposers._llm_validate import (
    AnswerError,
    parse_json,
    validate_patches,
    validate_priors,
)
from infrarsi.proposers.base import Context, Proposer, scope_of, workspace_of
from infrarsi.proposers.expert import ExpertProposer

log = logging.getLogger("infrarsi.proposers.llm")


class LLMProposer(Proposer):
    """Priors and patches from ``client`` (a :class:`ChatClient`); ``fallback`` when it fails."""

    name = "llm"

    def __init__(self, client: ChatClient, *, fallback: Proposer | None = None,
                 priors_max_tokens: int = 2048, patches_max_tokens: int = 4096) -> None:
        self.client = client
        self.fallback = fallback or ExpertProposer()
        self.priors_max_tokens = priors_max_tokens
        self.patches_max_tokens = patches_max_tokens
        self.stats: Counter[str] = Counter()
        # the last priors() call's answers per source, for the run's side-by-side log
        self.last_sources: dict[str, list[KnobPrior]] = {}

    @classmethod
    def from_spec(cls, spec: Any, **kw: Any) -> LLMProposer:
        if spec.llm is None:
            raise ValueError("the task spec has no llm: section (base_url, model); add one or use "
                             "the expert proposer")
        return cls(ChatClient.from_spec(spec.llm), **kw)

    @property
    def source(self) -> str:
        return f"llm:{self.client.model}"

    # ---- priors -----------------------------------------------------------------------
    def priors(self, context: Context) -> list[KnobPrior]:
        expert = self.fallback.priors(context)
        data = self._ask(context, priors_messages(context), PRIORS_SCHEMA, "priors",
                         self.priors_max_tokens)
        mine = validate_priors(data, context["space"], self.stats, self.source) if data else []
        self.last_sources = {self.fallback.name: list(expert), "llm": list(mine)}
        if not mine:
            self._fall_back("priors")
            return expert
        self.stats["priors_accepted"] += len(mine)
        taken = {(p.knob, json.dumps(p.setting, default=str)) for p in mine}
        return mine + [p for p in expert if (p.knob, json.dumps(p.setting, default=str)) not in taken]

    # ---- revision from live runs -------------------------------------------------------
    def revise(self, context: Context, current: list[KnobPrior]) -> list[tuple[KnobPrior, str]]:
        """Revised priors, each with the model's reason, from ``context["revisions"]`` (the
        priors judged by the live trials); [] when the model changes nothing or fails (logged)."""
        data = self._ask(context, revision_messages(context, current), REVISION_SCHEMA,
                         "revision", self.priors_max_tokens)
        out = []
        for item in (data or {}).get("priors", []):
            got = validate_priors({"priors": [item]}, context["space"], self.stats,
                                  f"{self.source}:revised")
            if got:
                out.append((got[0], str(item.get("reason", ""))[:500]))
        self.stats["revisions_accepted"] += len(out)
        return out

    # ---- patches ----------------------------------------------------------------------
    def patches(self, context: Context) -> list[Patch]:
        expert = self.fallback.patches(context)
        data = self._ask(context, patches_messages(context), PATCHES_SCHEMA, "patches",
                         self.patches_max_tokens)
        mine = validate_patches(data, workspace_of(context), scope_of(context), self.stats,
                                self.source) if data else []
        if not mine:
            self._fall_back("patches")
            return expert
        self.stats["patches_accepted"] += len(mine)
        digests = {p.digest for p in mine}
        return mine + [p for p in expert if p.digest not in digests]

    def repair(self, context: Context, rejected: list[tuple[Patch, Any]]) -> list[Patch]:
        """Corrected patches after the verifier rejected ``rejected`` ((patch, verdict) pairs,
        the reason fed back once); [] when the model withdraws them or fails (logged)."""
        data = self._ask(context, repair_messages(context, rejected), PATCHES_SCHEMA, "repair",
                         self.patches_max_tokens)
        mine = validate_patches(data, workspace_of(context), scope_of(context), self.stats,
                                f"{self.source}:repair") if data else []
        self.stats["repairs_accepted"] += len(mine)
        return mine

    # ---- one exchange -----------------------------------------------------------------
    def _ask(self, context: Context, messages: list[dict[str, str]], schema: dict[str, Any],
             name: str, max_tokens: int) -> dict[str, Any] | None:
        self.stats["requests"] += 1
        answer, meta = "", {"kind": name, "model": self.client.model}
        try:
            result = self.client.complete(messages, schema, name=name, max_tokens=max_tokens)
            answer, meta = result.content, {**meta, **result.meta}
            data = parse_json(answer, schema)
            self.stats["answers_ok"] += 1
            return data
        except LLMError as e:
            answer = e.answer
            meta["error"], meta["error_kind"] = str(e), e.kind
            self.stats[e.kind] += 1
            log.warning("LLM %s request failed (%s): %s", name, e.kind, e)
        except AnswerError as e:
            meta["error"], meta["error_kind"] = str(e), e.kind
            self.stats[e.kind] += 1
            log.warning("LLM %s answer refused (%s): %s", name, e.kind, e)
        finally:
            meta["retries_total"] = self.client.retries
            self._audit(context, messages, answer, meta)
        return None

    def _fall_back(self, what: str) -> None:
        self.stats["fallbacks"] += 1
        log.warning("LLM gave no usable %s; using the %s proposer's", what, self.fallback.name)

    def _audit(self, context: Context, messages: list[dict[str, str]], answer: str,
               meta: dict[str, Any]) -> None:
        bank, run_id = context.get("bank"), context.get("run_id")
        if bank is None or run_id is None:
            return
        try:
            bank.record_llm_exchange(run_id, json.dumps(messages), answer, meta)
        except Exception as e:  # noqa: BLE001 - the audit log must not stop a search
            self.stats["audit_failed"] += 1
            log.warning("could not store the LLM exchange in the bank: %s", e)
