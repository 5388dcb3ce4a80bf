"""One exception tree for InfraRSI; every message says what to do about it.

User mistakes are ``ValueError`` subclasses carrying the value received and the fix (a command,
a flag, a field). Exceptions cross Ray process boundaries, so each one pickles: keep the
constructor signature ``(message)`` and put extra state in plain attributes with defaults.
"""

from __future__ import annotations

__all__ = [
    "InfraRSIError",
    "ConfigError",
    "IllegalConfigError",
    "ContractError",
    "FrozenFileChangedError",
    "WorkloadError",
    "TrialError",
    "BankError",
    "PatchRejectedError",
    "PackageDataError",
    "ModelFallbackWarning",
]


class InfraRSIError(Exception):
    """Root of every error InfraRSI raises on purpose."""


class ConfigError(InfraRSIError, ValueError):
    """A task spec or other YAML/JSON input is wrong: unknown key, wrong type, bad value."""


class IllegalConfigError(InfraRSIError, ValueError):
    """A knob setting is unknown, out of its domain, or breaks a legality rule."""


class ContractError(InfraRSIError, ValueError):
    """The locked task contract is missing, malformed, or does not match this task."""


class FrozenFileChangedError(ContractError):
    """A file the contract froze has changed since ``infrarsi init``."""


class WorkloadError(InfraRSIError, ValueError):
    """The workload cannot be loaded: a missing file, a missing entry point, a bad interface."""


class TrialError(InfraRSIError):
    """A trial could not be run at all (not a trial that ran and failed: that is a record)."""


class BankError(InfraRSIError):
    """The experience bank refused an operation (schema, corruption, unreachable database)."""


class PatchRejectedError(InfraRSIError):
    """A source patch broke the contract; ``reason`` says which rule."""


class ModelFallbackWarning(UserWarning):
    """A cost model could not fit its data and fell back to its priors."""


class PackageDataError(InfraRSIError):
    """A file InfraRSI ships (patch catalog, seed experience, task specs) is missing from the
    installed package: a broken installation, never skipped silently."""
