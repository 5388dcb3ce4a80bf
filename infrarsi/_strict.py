"""A strict loader from YAML/JSON mappings into frozen dataclasses.

Unknown keys and wrong types are errors that name the dotted path and the file, the way
torchtitan and nanoGPT refuse an unknown config key. Supported field types: the scalars
(bool, int, float, str), ``X | None``, ``tuple[X, ...]``, ``dict[str, X]``, ``Any`` and
nested dataclasses.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from infrarsi.errors import ConfigError

T = TypeVar("T")


class _Loader(yaml.SafeLoader):
    """YAML 1.1 (PyYAML) reads ``3.12e14`` as a string: its float needs a dot and a signed
    exponent. Read every plain scientific number as a float, as YAML 1.2 and people do."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file; pass the path of an existing YAML file")
    try:
        return yaml.load(path.read_text(), Loader=_Loader) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None


def from_dict(cls: type[T], data: Any, *, source: str = "<dict>", path: str = "") -> T:
    """Build dataclass ``cls`` from ``data``; errors name ``source`` and the dotted ``path``."""
    where = f"{source}: {path or '<top level>'}"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        dotted = ", ".join(_join(path, k) for k in unknown)
        raise ConfigError(
            f"{source}: unknown key(s) {dotted}; allowed here: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], source, _join(path, name))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{source}: missing required key {_join(path, name)}")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _convert(tp: Any, value: Any, source: str, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                return _convert(a, value, source, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{source}: {path}: {value!r} fits none of {inner}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, source=source, path=path)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{source}: {path}: expected a list, got {type(value).__name__} {value!r}")
        item = args[0] if args else Any
        return tuple(_convert(item, v, source, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {path}: expected a mapping, got {type(value).__name__} {value!r}")
        vt = args[1] if len(args) == 2 else Any
        return {str(k): _convert(vt, v, source, _join(path, k)) for k, v in value.items()}
    if typing.get_origin(tp) is typing.Literal:
        if value not in args:
            raise ConfigError(f"{source}: {path}: {value!r} is not one of {list(args)}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{source}: {path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{source}: {path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            hint = ""
            if isinstance(value, str) and "e" in value.lower():
                hint = " (YAML reads a number like 3.12e14 as text here; write 3.12e+14)"
            raise ConfigError(f"{source}: {path}: expected a number, got {value!r}{hint}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{source}: {path}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # internal: a spec author's bug


def to_dict(obj: Any) -> Any:
    """The inverse of :func:`from_dict`: plain dicts, lists and scalars."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
