"""Promoted settings written where the user's job reads them (the task YAML's ``launch``).

``launch: {file: infrarsi.json, keys: {micro_batch_size: batch.micro, precision: dtype}}``
names a JSON or YAML file of the workspace and, for each knob, the (dotted) key the user's job
reads it from. ``apply`` sets every mapped knob of the promoted config there, on the branch,
leaving every other key of the file as it was.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from infrarsi.apply._git import ApplyRefusedError


def settings_text(current: str | None, file: str, keys: Mapping[str, str],
                  config: Mapping[str, Any]) -> str:
    """The file's new text: ``current`` (None: a new file) with the mapped knobs of
    ``config`` set at their keys."""
    is_json = file.endswith(".json")
    if not (is_json or file.endswith((".yaml", ".yml"))):
        raise ApplyRefusedError(f"launch.file {file!r} must be a .json, .yaml or .yml file")
    try:
        body = (json.loads(current) if is_json else yaml.safe_load(current)) if current else {}
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ApplyRefusedError(f"launch.file {file} is not valid {'JSON' if is_json else 'YAML'}"
                                f" ({e}); fix it and commit, then re-run apply") from None
    if not isinstance(body, dict):
        raise ApplyRefusedError(f"launch.file {file} must hold a mapping at its top level")
    unknown = sorted(k for k in keys if k not in config)
    if unknown:
        raise ApplyRefusedError(f"launch.keys names knob(s) {', '.join(unknown)} that the "
                                f"promoted config does not have; known: {', '.join(sorted(config))}")
    for knob, dotted in keys.items():
        node = body
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ApplyRefusedError(f"launch.keys.{knob}: {dotted!r} passes through a "
                                        f"value that is not a mapping in {file}")
        node[leaf] = config[knob]
    if is_json:
        return json.dumps(body, indent=2) + "\n"
    return yaml.safe_dump(body, sort_keys=False)
