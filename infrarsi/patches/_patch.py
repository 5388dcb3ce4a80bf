"""The patch record: a unified diff plus where it came from, why, and what it should buy."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infrarsi.errors import ConfigError
from infrarsi.space import PATCH_KNOB_PREFIX as KNOB_PREFIX

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class Patch:
    """A source change proposed for the editable scope of a workspace.

    ``diff`` is a unified diff whose paths are relative to the workspace root (``a/``/``b/``
    prefixes allowed). ``origin`` says who proposed it ("catalog", "bank:<run>", "llm:<model>").
    ``expected_log_time_effect`` / ``expected_log_mem_effect`` are the proposer's prior on the
    change of log step time / log peak memory (negative: faster / smaller), with ``*_std``.
    """

    id: str
    diff: str
    origin: str = "unknown"
    rationale: str = ""
    expected_log_time_effect: float | None = None
    expected_log_time_std: float = 0.3
    expected_log_mem_effect: float | None = None
    expected_log_mem_std: float = 0.3
    families: tuple[str, ...] = ()  # workload families it targets ("dense", "moe"); () = any
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _ID.match(self.id):
            raise ConfigError(f"patch id {self.id!r} must be 1-64 chars of [A-Za-z0-9_.-]")
        object.__setattr__(self, "families", tuple(self.families))

    @property
    def knob(self) -> str:
        """The bool knob name this patch takes in the search space."""
        return KNOB_PREFIX + self.id

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.diff.encode()).hexdigest()

    def files(self) -> tuple[str, ...]:
        """Paths the diff names (as written, prefixes stripped); empty when it does not parse."""
        from infrarsi.patches._diff import DiffError, parse_diff

        try:
            return tuple(dict.fromkeys(p for fd in parse_diff(self.diff) for p in fd.paths))
        except DiffError:
            return ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["families"] = list(self.families)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Patch:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown patch field(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    @staticmethod
    def content_id(diff: str, prefix: str = "p") -> str:
        return f"{prefix}-{hashlib.sha256(diff.encode()).hexdigest()[:10]}"


def load_patch(yaml_path: Path) -> tuple[Patch, dict[str, Any]]:
    """A catalog entry: ``<id>.yaml`` (metadata) beside ``<id>.diff``.

    Returns the patch and the catalog-only fields (``expect``: accept|reject, ``expect_rule``).
    """
    meta = yaml.safe_load(yaml_path.read_text()) or {}
    if not isinstance(meta, dict):
        raise ConfigError(f"{yaml_path}: patch metadata must be a mapping")
    extra = {k: meta.pop(k) for k in ("expect", "expect_rule", "variant") if k in meta}
    pid = meta.pop("id", yaml_path.stem)
    diff_path = yaml_path.with_suffix(".diff")
    if not diff_path.is_file():
        raise ConfigError(f"{yaml_path}: no diff beside it ({diff_path.name})")
    try:
        patch = Patch.from_dict({"id": pid, "diff": diff_path.read_text(), **meta})
    except ConfigError as e:
        raise ConfigError(f"{yaml_path}: {e}") from None
    return patch, extra
