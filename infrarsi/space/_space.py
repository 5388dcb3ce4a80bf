"""Typed knobs and legality rules, declared once and shared by every searcher and backend."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infrarsi.errors import IllegalConfigError

Config = dict[str, Any]


@dataclass(frozen=True)
class Knob:
    """One launch knob: its real launch name, its finite domain, and when it applies.

    ``active_if`` returns False when the knob is irrelevant to a config (e.g. DDP bucket size
    under FSDP); an inactive knob is normalized to ``default`` so equivalent configs compare
    equal. ``kind`` tells encoders how to read values: "ordinal" (ordered numbers, encoded on a
    log2 scale when all positive), "categorical" or "bool". A patch is a bool knob.
    """

    name: str
    values: tuple[Any, ...]
    default: Any
    kind: str = "categorical"
    description: str = ""
    active_if: Callable[[Mapping[str, Any]], bool] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(self.values))
        if self.default not in self.values:
            raise IllegalConfigError(
                f"knob {self.name!r}: default {self.default!r} is not in its domain {self.values}"
            )
        if self.kind not in ("ordinal", "categorical", "bool"):
            raise IllegalConfigError(f"knob {self.name!r}: unknown kind {self.kind!r}")

    def is_active(self, config: Mapping[str, Any]) -> bool:
        return self.active_if is None or bool(self.active_if(config))


@dataclass(frozen=True)
class Rule:
    """A legality rule across knobs: ``check(config)`` returns None, or what is wrong and the fix."""

    name: str
    check: Callable[[Mapping[str, Any]], str | None]


@dataclass(frozen=True)
class SearchSpace:
    """Knobs plus legality rules. Illegal configs never reach a backend.

    ``allowed`` optionally restricts the space to an explicit finite set of configs (a measured
    table's rows): then a config outside the set is illegal too.
    """

    knobs: tuple[Knob, ...]
    rules: tuple[Rule, ...] = ()
    allowed: tuple[Config, ...] | None = None
    _allowed_keys: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "knobs", tuple(self.knobs))
        object.__setattr__(self, "rules", tuple(self.rules))
        names = [k.name for k in self.knobs]
        if len(set(names)) != len(names):
            raise IllegalConfigError(f"duplicate knob names in {names}")
        if self.allowed is not None:
            allowed = tuple(self.normalize(c, check=False) for c in self.allowed)
            object.__setattr__(self, "allowed", allowed)
            object.__setattr__(self, "_allowed_keys", frozenset(config_key(c) for c in allowed))

    # ---- lookup -----------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def knob(self, name: str) -> Knob:
        for k in self.knobs:
            if k.name == name:
                return k
        raise IllegalConfigError(f"unknown knob {name!r}; known knobs: {', '.join(self.names)}")

    def defaults(self) -> Config:
        return self.normalize({k.name: k.default for k in self.knobs}, check=False)

    # ---- legality ---------------------------------------------------------------------
    def normalize(self, config: Mapping[str, Any], *, check: bool = True) -> Config:
        """Fill missing knobs with defaults, reset inactive knobs, then (optionally) validate."""
        unknown = set(config) - set(self.names)
        if unknown:
            raise IllegalConfigError(
                f"unknown knob(s) {sorted(unknown)}; known knobs: {', '.join(self.names)}"
            )
        out = {k.name: config.get(k.name, k.default) for k in self.knobs}
        for k in self.knobs:
            if not k.is_active(out):
                out[k.name] = k.default
        if check:
            self.validate(out)
        return out

    def violations(self, config: Mapping[str, Any]) -> list[str]:
        """Every reason ``config`` is illegal (empty when legal)."""
        problems = []
        for k in self.knobs:
            if k.name not in config:
                problems.append(f"knob {k.name!r} is missing")
            elif config[k.name] not in k.values:
                problems.append(
                    f"knob {k.name!r} = {config[k.name]!r} is outside its domain "
                    f"{list(k.values)}"
                )
        if problems:
            return problems
        for rule in self.rules:
            msg = rule.check(config)
            if msg:
                problems.append(f"{rule.name}: {msg}")
        if self._allowed_keys is not None and config_key(config) not in self._allowed_keys:
            problems.append("this config was never measured in the table, so it cannot be replayed")
        return problems

    def is_legal(self, config: Mapping[str, Any]) -> bool:
        return not self.violations(config)

    def validate(self, config: Mapping[str, Any]) -> None:
        problems = self.violations(config)
        if problems:
            raise IllegalConfigError(
                f"illegal config {dict(config)}: " + "; ".join(problems)
            )

    # ---- enumeration ------------------------------------------------------------------
    def size_upper_bound(self) -> int:
        if self.allowed is not None:
            return len(self.allowed)
        n = 1
        for k in self.knobs:
            n *= len(k.values)
        return n

    def enumerate(self, limit: int | None = 200_000) -> list[Config]:
        """All distinct legal configs (the table's rows when ``allowed`` is set)."""
        if self.allowed is not None:
            return [dict(c) for c in self.allowed]
        if limit is not None and self.size_upper_bound() > limit:
            raise IllegalConfigError(
                f"space has up to {self.size_upper_bound()} configs; use sample() instead"
            )
        seen: dict[str, Config] = {}
        for values in itertools.product(*(k.values for k in self.knobs)):
            c = self.normalize(dict(zip(self.names, values, strict=True)), check=False)
            key = config_key(c)
            if key not in seen and self.is_legal(c):
                seen[key] = c
        return list(seen.values())

    def sample(self, n: int, rng: random.Random) -> list[Config]:
        """Up to ``n`` distinct legal configs drawn uniformly (rejection sampling)."""
        if self.allowed is not None or self.size_upper_bound() <= 50_000:
            pool = self.enumerate(limit=None)
            return rng.sample(pool, min(n, len(pool)))
        out: dict[str, Config] = {}
        for _ in range(50 * n):
            c = self.normalize({k.name: rng.choice(k.values) for k in self.knobs}, check=False)
            if self.is_legal(c):
                out.setdefault(config_key(c), c)
            if len(out) >= n:
                break
        return list(out.values())

    def neighbours(self, config: Mapping[str, Any]) -> Iterator[Config]:
        """Legal configs that differ from ``config`` in exactly one knob's value."""
        base = self.normalize(config, check=False)
        seen = {config_key(base)}
        for k in self.knobs:
            for v in k.values:
                if v == base[k.name]:
                    continue
                c = self.normalize({**base, k.name: v}, check=False)
                key = config_key(c)
                if key not in seen and self.is_legal(c):
                    seen.add(key)
                    yield c

    def with_knobs(self, extra: Iterable[Knob], rules: Sequence[Rule] = ()) -> SearchSpace:
        """A new space with more knobs (e.g. verified patches as bool knobs)."""
        return SearchSpace(self.knobs + tuple(extra), self.rules + tuple(rules), self.allowed)


def config_key(config: Mapping[str, Any]) -> str:
    """A canonical string for a config: equal configs give equal keys."""
    return json.dumps(dict(sorted(config.items())), sort_keys=True, default=str)
