"""Count each shipped example's glue: the lines a user writes to bring their job to InfraRSI
(the adapter module and the task YAML; for an own loop, the task YAML and the script's lines
that call ``infrarsi``), non-blank and not comments. Docstrings count.

    python scripts/example_glue.py [EXAMPLE ...]      # default: every folder in examples/
"""

from __future__ import annotations

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
LIMIT = 30  # issue 27: the glue is at most 30 lines per example


def code_lines(path: Path) -> list[str]:
    lines = [s.strip() for s in path.read_text().splitlines()]
    return [s for s in lines if s and not s.startswith("#")]


def glue(example: Path) -> dict[str, int]:
    """Lines of glue per file of one example."""
    out = {"infrarsi.yaml": len(code_lines(example / "infrarsi.yaml"))}
    adapter = example / "infrarsi_adapter.py"
    if adapter.is_file():
        out[adapter.name] = len(code_lines(adapter))
    else:  # an own loop: the script's own lines that call InfraRSI
        script = example / "train.py"
        calls = [s for s in code_lines(script) if s.startswith(("import infrarsi", "from infrarsi"))
                 or "infrarsi.prepare(" in s or "infrarsi.step(" in s]
        out[f"{script.name} (infrarsi lines)"] = len(calls)
    return out


def main(names: list[str]) -> int:
    names = names or sorted(p.name for p in EXAMPLES.iterdir() if (p / "infrarsi.yaml").is_file())
    over = 0
    for name in names:
        parts = glue(EXAMPLES / name)
        total = sum(parts.values())
        over += total > LIMIT
        detail = " + ".join(f"{f} {n}" for f, n in parts.items())
        print(f"{name}: glue {total} lines ({detail}); limit {LIMIT}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
