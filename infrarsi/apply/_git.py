"""The few git operations apply needs, as plain subprocess calls with readable errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from infrarsi.errors import InfraRSIError


class ApplyRefusedError(InfraRSIError):
    """``infrarsi apply`` will not write a branch; the message names the files and the fix."""


def git(repo: Path, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=120)
    except FileNotFoundError:
        raise ApplyRefusedError("git is not installed; install it (apt-get install git)") from None
    if check and proc.returncode != 0:
        raise ApplyRefusedError(f"`git {' '.join(args)}` failed in {repo}: "
                                f"{(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def repo_root(path: Path) -> Path:
    """The top of the git work tree that holds ``path``."""
    start = path if path.is_dir() else path.parent
    proc = subprocess.run(["git", "-C", str(start), "rev-parse", "--show-toplevel"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise ApplyRefusedError(f"{path} is not inside a git repository; pass --repo PATH to the "
                                "repository holding your training code (or `git init` it)")
    return Path(proc.stdout.strip()).resolve()


def dirty_files(repo: Path, ignore_under: list[Path]) -> list[str]:
    """Changed, staged and untracked (not ignored) paths, except those under ``ignore_under``."""
    out = git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    paths = []
    entries = out.split("\0")
    i = 0
    while i < len(entries):
        e = entries[i]
        i += 1
        if not e:
            continue
        code, path = e[:2], e[3:]
        if code[0] in "RC":  # a rename carries its source path as the next entry
            i += 1
        full = (repo / path).resolve()
        if any(full == d or d in full.parents for d in ignore_under):
            continue
        paths.append(f"{path} ({_describe(code)})")
    return paths


def _describe(code: str) -> str:
    if code == "??":
        return "untracked"
    if "D" in code:
        return "deleted"
    if code[0] != " " and code[1] == " ":
        return "staged"
    return "modified"


def branch_exists(repo: Path, name: str) -> bool:
    return bool(git(repo, "branch", "--list", name).strip())


def identity_env(repo: Path) -> dict[str, str]:
    """Author/committer for the commit: the user's git identity, else a labelled fallback."""
    name = git(repo, "config", "user.name", check=False).strip()
    email = git(repo, "config", "user.email", check=False).strip()
    if name and email:
        return {}
    return {"GIT_AUTHOR_NAME": name or "InfraRSI", "GIT_AUTHOR_EMAIL": email or "infrarsi@localhost",
            "GIT_COMMITTER_NAME": name or "InfraRSI",
            "GIT_COMMITTER_EMAIL": email or "infrarsi@localhost"}
