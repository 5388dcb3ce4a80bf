"""The task spec (a YAML file; the reference ones ship in infrarsi/configs/tasks, which the
checkout's configs/ links to): frozen dataclasses loaded by the strict loader."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from infrarsi._home import runs_root
from infrarsi._resources import task_spec_path
from infrarsi._strict import from_dict, load_yaml, to_dict
from infrarsi.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """The model's architecture. ``num_experts``/``top_k`` are zero for a dense model."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    ffn_hidden_size: int
    num_experts: int = 0
    top_k: int = 0
    aux_loss_weight: float = 0.01
    # The reference models use rotary position embeddings, which need an even head dimension;
    # a model with learned positions sets this false and the rule does not apply.
    rotary: bool = True

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} must be divisible by num_heads {self.num_heads}"
            )
        if self.rotary and (self.hidden_size // self.num_heads) % 2:
            raise ConfigError(
                f"hidden_size / num_heads = {self.hidden_size // self.num_heads} must be even for "
                "rotary embeddings; set shape.rotary: false for a model without them")
        if self.num_experts and not 0 < self.top_k <= self.num_experts:
            raise ConfigError(f"top_k {self.top_k} must be in 1..num_experts ({self.num_experts})")


@dataclass(frozen=True)
class WorkloadSpec:
    """The user's training code and the work one optimizer step does.

    ``workspace`` is the directory of the user's code (relative to the YAML file); ``entry`` is
    the file in it that is the entry point (its interface is frozen by the contract):

    * without ``shape``: the user's adapter, ``build_model()``, ``batches(ctx)``,
      ``loss(model, batch)``, ``tokens(batch)`` (:mod:`infrarsi.harness.workload`); the shape
      (parameters, layers, width, heads) and the tokens per step are read from the model and
      the data, so the YAML names only ``global_batch_size`` (rows per optimizer step);
    * with ``shape``: ``build_model(shape: dict, parallel: dict) -> torch.nn.Module`` fed by the
      harness's synthetic tokens (the reference workloads).
    """

    workspace: str
    global_batch_size: int
    family: str = "dense"
    shape: ModelShape | None = None
    seq_len: int = 0
    entry: str = "entry.py"
    # The user's own training loop: a script in the workspace that calls infrarsi.prepare and
    # infrarsi.step (infrarsi.harness.own_loop), run with these arguments; no entry then.
    script: str | None = None
    script_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.family not in ("dense", "moe"):
            raise ConfigError(f"family {self.family!r} must be 'dense' or 'moe'")
        if self.shape is None and self.family == "moe":
            raise ConfigError("an adapter workload (no shape) is tuned as dense; remove family: moe")
        if self.family == "moe" and not self.shape.num_experts:
            raise ConfigError("a moe workload needs shape.num_experts > 0 and shape.top_k")
        if self.global_batch_size <= 0 or self.seq_len < 0:
            raise ConfigError("global_batch_size must be positive (and seq_len not negative)")
        if self.script and self.shape is not None:
            raise ConfigError("workload.script (your own loop) reads the shape from your model; "
                              "remove workload.shape")
        if self.shape is not None and self.seq_len <= 0:
            raise ConfigError("a workload with a shape needs a positive seq_len")

    @property
    def adapter(self) -> bool:
        """True for the user's own model, data and loss (no shape in the YAML)."""
        return self.shape is None

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one optimizer step as the YAML states them (0 for an adapter workload:
        its tokens are counted from its data and locked by the contract)."""
        return self.global_batch_size * self.seq_len


@dataclass(frozen=True)
class ScopeSpec:
    """What a patch may touch. Globs are relative to the workspace."""

    editable: tuple[str, ...] = ("**/*.py",)
    frozen: tuple[str, ...] = ("entry.py",)


@dataclass(frozen=True)
class LossReferenceSpec:
    """K steps of the baseline at a fixed seed; a later run must reproduce them within tolerance.

    ``rtol`` None picks a tolerance that fits the precision (fp32 tight, bf16 looser).
    """

    steps: int = 4
    seed: int = 1234
    rtol: float | None = None


@dataclass(frozen=True)
class TimingSpec:
    """The harness-owned timing protocol: warm-up steps (compile included) are not measured;
    on CPU one more step after the measured ones runs under the memory meter, off the clock
    (``infrarsi.harness.train.METERED_STEPS``)."""

    warmup_steps: int = 2
    measured_steps: int = 5

    def __post_init__(self) -> None:
        if self.warmup_steps < 1 or self.measured_steps < 2:
            raise ConfigError("timing needs warmup_steps >= 1 and measured_steps >= 2")


@dataclass(frozen=True)
class HardwareSpec:
    """Where trials run. On CPU ``memory_capacity_gib`` is the emulated per-worker capacity."""

    device: str = "cpu"
    max_workers: int = 2
    cpus_per_worker: int = 1
    memory_capacity_gib: float | None = None
    device_name: str | None = None
    peak_flops: float | None = None
    interconnect: str = "loopback"

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ConfigError(f"device {self.device!r} must be 'cpu' or 'cuda'")
        if self.memory_capacity_gib is not None and self.memory_capacity_gib <= 0:
            raise ConfigError("hardware.memory_capacity_gib must be positive (or left out)")

    def capacity_gib(self) -> float | None:
        """The memory capacity per worker: the spec's, else on CPU this machine's memory
        shared by ``max_workers`` (an emulated device of a fair share)."""
        if self.memory_capacity_gib or self.device != "cpu":
            return self.memory_capacity_gib
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # not POSIX: no emulated capacity
            return None
        return round(total / 2**30 / max(self.max_workers, 1), 3)


@dataclass(frozen=True)
class TrialSpec:
    """Limits for one trial. A trial past ``timeout_s`` is ended and recorded as a timeout."""

    timeout_s: float = 600.0
    placement_strategy: str = "PACK"


@dataclass(frozen=True)
class SearchSpec:
    """The locked baseline and optional restrictions of each knob's domain."""

    baseline: dict[str, Any] = field(default_factory=dict)
    restrict: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    exclude_knobs: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifySpec:
    """How a candidate is promoted. ``min_effect``: the smallest speedup worth promoting (0.03:
    3% faster); the verification's own interval must clear ``1 + min_effect``
    (``infrarsi.search.verify``)."""

    min_effect: float = 0.03

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_effect < 1.0:
            raise ConfigError(f"verify.min_effect {self.min_effect!r} must be a fraction in "
                              "[0, 1), e.g. 0.03 for 3% faster")


@dataclass(frozen=True)
class BankSpec:
    """Where experience is kept. ``url`` None: $INFRARSI_BANK_URL, else $INFRARSI_HOME/bank.sqlite."""

    url: str | None = None


@dataclass(frozen=True)
class LLMSpec:
    """A locally served vLLM model (OpenAI-compatible API). Absent: the expert proposer only."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""
    api_key_env: str = "INFRARSI_LLM_API_KEY"
    timeout_s: float = 60.0


@dataclass(frozen=True)
class LaunchSpec:
    """Where the user's job reads its launch settings: ``file`` (JSON or YAML, relative to the
    workspace) and, per knob, the dotted ``keys`` it is read from. ``infrarsi apply`` writes the
    promoted knobs there (``infrarsi.apply._settings``)."""

    file: str
    keys: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    workload: WorkloadSpec
    hardware: HardwareSpec
    scope: ScopeSpec = field(default_factory=ScopeSpec)
    loss_reference: LossReferenceSpec = field(default_factory=LossReferenceSpec)
    timing: TimingSpec = field(default_factory=TimingSpec)
    trial: TrialSpec = field(default_factory=TrialSpec)
    search: SearchSpec = field(default_factory=SearchSpec)
    bank: BankSpec = field(default_factory=BankSpec)
    verify: VerifySpec = field(default_factory=VerifySpec)
    llm: LLMSpec | None = None
    launch: LaunchSpec | None = None
    # "" : <home>/runs/{name} (infrarsi._home); a relative path is relative to the current folder
    run_dir: str = ""
    # Where the spec was read from; relative paths in it are relative to this directory.
    base_dir: str = ""

    def workspace_path(self) -> Path:
        p = Path(self.workload.workspace)
        return (Path(self.base_dir) / p).resolve() if not p.is_absolute() else p

    def run_path(self) -> Path:
        if not self.run_dir:
            return runs_root() / self.name
        p = Path(self.run_dir.format(name=self.name)).expanduser()
        return p if p.is_absolute() else (Path.cwd() / p)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> TaskSpec:
        return from_dict(cls, data, source=source)


def _is_task_name(path: str | Path) -> bool:
    """A bare name (no folder, no .yaml) that is not a file here: a built-in task's name."""
    p = Path(path)
    return (isinstance(path, str) and p.name == path and p.suffix not in (".yaml", ".yml")
            and not p.exists())


def load_task(path: str | Path) -> TaskSpec:
    """Load and check a task spec; relative paths in it resolve against the file's directory.

    ``path`` is a YAML file, or the name of a task spec shipped with the package (``cpu_dense``,
    ``cpu_moe``, ``gpu_dense``, ``gpu_moe``) when no such file exists.
    """
    if _is_task_name(path):
        path = task_spec_path(str(path))
    path = Path(path).resolve()
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the task spec must be a mapping at the top level")
    data = {**data, "base_dir": str(path.parent)}
    spec = TaskSpec.from_dict(data, source=str(path))
    if spec.hardware.memory_capacity_gib is None and spec.hardware.capacity_gib():
        # Defaulted here, so the contract locks the capacity the baseline ran under.
        spec = replace(spec, hardware=replace(spec.hardware,
                                              memory_capacity_gib=spec.hardware.capacity_gib()))
    ws = spec.workspace_path()
    if not ws.is_dir():
        raise ConfigError(
            f"{path}: workload.workspace {spec.workload.workspace!r} resolves to {ws}, which is not "
            "a directory; point it at the folder holding your training code"
        )
    if spec.workload.script:
        if not (ws / spec.workload.script).is_file():
            raise ConfigError(f"{path}: workload.script {spec.workload.script!r} not found in "
                              f"{ws}; name your training script, relative to the workspace")
    elif not (ws / spec.workload.entry).is_file():
        what = ("build_model(), batches(ctx), loss(model, batch) and tokens(batch)"
                if spec.workload.adapter else "build_model(shape, parallel)")
        raise ConfigError(
            f"{path}: workload.entry {spec.workload.entry!r} not found in {ws}; name the file of "
            f"your workspace that defines {what}"
        )
    return spec
