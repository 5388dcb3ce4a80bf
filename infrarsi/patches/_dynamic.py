"""Dynamic checks: run the baseline and the patched model side by side and compare.

Three checks, each catching what the others and the static scan cannot:

* **probe** — the baseline's side is a reference computed in a clean process
  (:func:`probe_reference`: weights, per-call losses and gradient sketches); the patched model
  is built at the contract's seed in another process (:func:`probe_candidate`), loaded with the
  baseline's weights (same state dict: names and shapes, else rejected), then fed the exact
  micro-batch sequence a one-rank trial feeds (harness data, micro-batch 1, every step of a
  trial, so a patch that counts calls and cheats "after warm-up" is still in range). Every call
  compares the output shape (the work), the loss and every parameter's gradient in fp32.
* **training** — the harness's own ``train_worker`` (world 1, under a process group) runs each
  workspace in its own process over every step; the loss traces must agree within the
  contract's tolerance and the state after the last step within :data:`CHECKSUM_RTOL`. This
  catches stale caches that the fixed-weight probe cannot see (weights move between steps).
* **tamper** — identities of the clock, barrier, sync, loss, optimizer and harness functions,
  live threads, the environment, global numerics and tracer hooks are snapshotted before the
  patched code is imported and compared after it ran.
"""

from __future__ import annotations

import builtins
import math
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch

from infrarsi.contract.spec import TaskSpec
from infrarsi.harness import clock as _clock
from infrarsi.harness import data as _data
from infrarsi.harness import loss as _loss
from infrarsi.harness import mechanisms as _mech
from infrarsi.harness import train as _train
from infrarsi.harness._workspace import load_entry
from infrarsi.harness.stats import shape_dict

PARALLEL = {"rank": 0, "world_size": 1, "expert_parallel_degree": 1, "group": None}


class CheckFailed(Exception):
    """A dynamic check failed; ``rule`` names it, the message says what differed, ``evidence``
    (optional) what the checks before it measured."""

    def __init__(self, message: str, rule: str, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.evidence = dict(evidence or {})


# ---- tamper sentinels ---------------------------------------------------------------------
def _watched() -> dict[str, Any]:
    import time

    import torch.distributed as dist
    import torch.nn.functional as F

    items: dict[str, Any] = {
        "time.perf_counter": time.perf_counter, "time.perf_counter_ns": time.perf_counter_ns,
        "time.time": time.time, "time.monotonic": time.monotonic, "time.sleep": time.sleep,
        "dist.barrier": dist.barrier, "dist.all_reduce": dist.all_reduce,
        "torch.cuda.synchronize": torch.cuda.synchronize, "torch.manual_seed": torch.manual_seed,
        "F.cross_entropy": F.cross_entropy, "Tensor.backward": torch.Tensor.backward,
        "autograd.backward": torch.autograd.backward, "AdamW.step": torch.optim.AdamW.step,
        "Module.__call__": torch.nn.Module.__call__, "Module._call_impl": torch.nn.Module._call_impl,
        "builtins.open": builtins.open, "StepClock.mark": _clock.StepClock.mark,
    }
    for mod in (_clock, _data, _loss, _mech, _train):
        for name, obj in vars(mod).items():
            if callable(obj) and not name.startswith("__"):
                items[f"{mod.__name__}.{name}"] = obj
    return items


def prime() -> None:
    """Let torch install its own lazy wrappers (dynamo's ``manual_seed`` guard, the optimizer's
    profiling ``step`` hook) before the first snapshot, so they are not mistaken for tampering."""
    import torch._dynamo  # noqa: F401

    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p])
    torch.nn.functional.scaled_dot_product_attention(*(torch.zeros(1, 1, 2, 2),) * 3, is_causal=True)
    p.sum().backward()
    opt.step()


def snapshot() -> dict[str, Any]:
    from torch.nn.modules import module as _m

    return {
        "ids": {k: id(v) for k, v in _watched().items()},
        "objects": _watched(),
        "threads": {t.ident for t in threading.enumerate() if t.is_alive()},
        "environ": dict(os.environ),
        "numerics": (torch.get_default_dtype(), torch.get_float32_matmul_precision(),
                     torch.are_deterministic_algorithms_enabled()),
        "tracers": (sys.gettrace(), sys.getprofile()),
        "global_hooks": tuple(len(getattr(_m, n, {})) for n in (
            "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
            "_global_backward_pre_hooks")),
    }


def restore(before: dict[str, Any]) -> None:
    """Undo a detected monkeypatch of a watched function (best effort)."""
    import importlib

    for name, obj in before["objects"].items():
        owner_name, _, attr = name.rpartition(".")
        aliases = {"time": "time", "dist": "torch.distributed", "F": "torch.nn.functional",
                   "torch.cuda": "torch.cuda", "torch": "torch", "builtins": "builtins"}
        owners = {"Tensor": torch.Tensor, "autograd": torch.autograd, "AdamW": torch.optim.AdamW,
                  "Module": torch.nn.Module, "StepClock": _clock.StepClock}
        owner = owners.get(owner_name)
        if owner is None:
            try:
                owner = importlib.import_module(aliases.get(owner_name, owner_name))
            except ImportError:
                continue
        if getattr(owner, attr, None) is not obj:
            setattr(owner, attr, obj)


def compare_snapshot(before: dict[str, Any], after: dict[str, Any]) -> str | None:
    changed = sorted(k for k, v in before["ids"].items() if after["ids"].get(k) != v)
    if changed:
        return f"replaces {', '.join(changed)} at run time (monkeypatches the harness or torch)"
    new_threads = after["threads"] - before["threads"]
    if new_threads:
        return f"leaves {len(new_threads)} new thread(s) running (moves work out of the timed region)"
    if after["environ"] != before["environ"]:
        keys = sorted(set(after["environ"]) ^ set(before["environ"]) |
                      {k for k in before["environ"] if after["environ"].get(k) != before["environ"][k]})
        return f"changes the environment ({', '.join(keys[:5])})"
    if after["numerics"] != before["numerics"]:
        return f"changes global numerics {before['numerics']} -> {after['numerics']}"
    if after["tracers"] != before["tracers"]:
        return "installs a trace or profile hook"
    if after["global_hooks"] != before["global_hooks"]:
        return "installs a global module hook"
    return None


# ---- probe ------------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def probe_batches(spec: TaskSpec, calls: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Harness micro-batches as trials see them: first one step at every micro-batch size
    larger than 1 (a patch keyed on the batch shape shows), then ``calls`` micro-batches of size
    1, step after step (a patch that counts calls and cheats later is still in range)."""
    wl, seed = spec.workload, spec.loss_reference.seed

    def batch(step: int) -> torch.Tensor:
        return _data.global_batch(seed, step, wl.global_batch_size, wl.seq_len, wl.shape.vocab_size)

    for i, mbs in enumerate(d for d in reversed(_divisors(wl.global_batch_size)) if d > 1):
        yield from _data.micro_batches(batch(i), 0, 1, mbs)
    n, step = 0, 0
    while n < calls:
        for inputs, targets in _data.micro_batches(batch(step), 0, 1, 1):
            if n >= calls:
                return
            yield inputs, targets
            n += 1
        step += 1


def default_calls(spec: TaskSpec) -> int:
    """Forward calls of the longest one-rank trial (micro-batch 1): every step, every row."""
    t, ref = spec.timing, spec.loss_reference
    return max(t.warmup_steps + t.measured_steps, ref.steps) * spec.workload.global_batch_size


def _build(entry, spec: TaskSpec) -> torch.nn.Module:
    seed = spec.loss_reference.seed
    torch.manual_seed(seed)
    group = torch.distributed.group.WORLD if torch.distributed.is_initialized() else None
    model = entry.build_model(shape_dict(spec), {**PARALLEL, "group": group})
    if torch.initial_seed() != seed:
        raise CheckFailed(f"reseeds the random generator while building the model "
                          f"(seed {torch.initial_seed()} instead of the contract's {seed})", "seed")
    return model.float().train()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    num = float((a.double() - b.double()).norm())
    den = float(b.double().norm())
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def probe_reference(base_ws: str, spec: TaskSpec, *, calls: int) -> dict[str, Any]:
    """The baseline's side of the probe, computed in a clean process (no patched code in it):
    the initial and the perturbed weights, and per call the loss, the output shape and a sketch
    of every parameter's gradient (:class:`Sketcher`), for :func:`probe_candidate`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with load_entry(base_ws, spec.workload.entry) as eb:
            base = _build(eb, spec)
            sk = Sketcher(base, spec.loss_reference.seed)
            state = {k: v.detach().clone() for k, v in base.state_dict().items()}
            aux_w = float(spec.workload.shape.aux_loss_weight)
            rows = [_reference_call(base, i, t, aux_w, sk) for i, t in probe_batches(spec, calls)]
            _perturb(base, spec.loss_reference.seed)
            perturbed = {k: v.detach().clone() for k, v in base.state_dict().items()}
            after = [_reference_call(base, i, t, aux_w, sk) for i, t in _after_batches(spec)]
    finally:
        torch.set_num_threads(threads)
    return {"n_calls": calls, "state": state, "perturbed": perturbed, "calls": rows,
            "after": after}


def _reference_call(model, inputs, targets, aux_w, sk: Sketcher) -> dict[str, Any]:
    model.zero_grad(set_to_none=True)
    loss, shape = _forward_backward(model, inputs, targets, aux_w)
    return {"loss": loss, "shape": shape, "grads": sk.grads(model)}


def _after_batches(spec: TaskSpec):
    wl = spec.workload
    batch = _data.global_batch(spec.loss_reference.seed, 10_000, wl.global_batch_size,
                               wl.seq_len, wl.shape.vocab_size)
    return _data.micro_batches(batch, 0, 1, 1)


class Sketcher:
    """Random projections of each parameter's gradient (fixed per parameter, float64): two
    gradients' sketch distance over the reference's sketch norm estimates their relative
    difference (Johnson-Lindenstrauss), so the reference need not keep whole gradients."""

    DIM = 16

    def __init__(self, model: torch.nn.Module, seed: int) -> None:
        g = torch.Generator().manual_seed(seed + 2)
        self.proj = {n: torch.randn(self.DIM, p.numel(), generator=g, dtype=torch.float64)
                     / self.DIM ** 0.5 for n, p in model.named_parameters()}

    def grads(self, model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
        return {n: None if p.grad is None else self.proj[n] @ p.grad.detach().reshape(-1).double()
                for n, p in model.named_parameters()}


def probe_candidate(patched_ws: str, spec: TaskSpec, ref: dict[str, Any], *, rtol: float,
                    atol: float = 1e-7, after_build=None) -> dict[str, Any]:
    """Feed the patched model (loaded with the reference's weights) the probe's micro-batches and
    compare each call with the clean baseline's reference; raise CheckFailed at the first drift.

    Runs on one intra-op thread (as the baseline trial does): on a shared box more threads
    oversubscribe the cores and make the probe many times slower.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _probe(patched_ws, spec, ref, rtol=rtol, atol=atol, after_build=after_build)
    finally:
        torch.set_num_threads(threads)


def _probe(patched_ws: str, spec: TaskSpec, ref: dict[str, Any], *, rtol: float,
           atol: float, after_build=None) -> dict[str, Any]:
    with load_entry(patched_ws, spec.workload.entry) as ep:
        try:
            patched = _build(ep, spec)
        except CheckFailed:
            raise
        except Exception as e:  # noqa: BLE001 - the patched code's own failure
            raise CheckFailed(f"the patched model fails to build: {type(e).__name__}: {e}", "crash") from None
        if after_build is not None:
            after_build()  # what importing and building the patched code changed, first
        bsd, psd = ref["state"], patched.state_dict()
        if {k: tuple(v.shape) for k, v in bsd.items()} != {k: tuple(v.shape) for k, v in psd.items()}:
            diff = sorted(set(bsd) ^ set(psd))[:4]
            raise CheckFailed(f"changes the model's state dict (parameters or buffers: {diff}); a "
                              "patch must keep the checkpoint format", "work")
        patched.load_state_dict(bsd)
        cmp = _Comparer(patched, spec, rtol, atol)
        for (inputs, targets), want in zip(probe_batches(spec, ref["n_calls"]), ref["calls"],
                                           strict=True):
            cmp.call(inputs, targets, want)
        # The weights moved as an optimizer step would (the reference's perturbed weights): a
        # cache of anything weight-derived (work moved "before warm-up ends") is now stale.
        patched.load_state_dict(ref["perturbed"])
        for (inputs, targets), want in zip(_after_batches(spec), ref["after"], strict=True):
            cmp.call(inputs, targets, want, note=" after a weight update")
    return {"probe_calls": cmp.n, "probe_max_loss_rel": cmp.worst_loss,
            "probe_max_grad_rel": cmp.worst_grad}


def _perturb(model: torch.nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, p in model.named_parameters():
            scale = 0.25 * float(p.abs().mean()) + 1e-3
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)


class _Comparer:
    """One call of the patched model, compared with the reference's; raises CheckFailed."""

    def __init__(self, patched, spec: TaskSpec, rtol: float, atol: float) -> None:
        self.patched, self.rtol, self.atol = patched, rtol, atol
        self.aux_w = float(spec.workload.shape.aux_loss_weight)
        self.vocab = spec.workload.shape.vocab_size
        self.sk = Sketcher(patched, spec.loss_reference.seed)
        self.n = 0
        self.worst_loss = self.worst_grad = 0.0

    def call(self, inputs, targets, want: dict[str, Any], note: str = "") -> None:
        i, rtol = self.n, self.rtol
        self.n += 1
        self.patched.zero_grad(set_to_none=True)
        lb = want["loss"]
        try:
            lp, shape = _forward_backward(self.patched, inputs, targets, self.aux_w)
        except CheckFailed:
            raise
        except Exception as e:  # noqa: BLE001 - the patched code's own failure
            raise CheckFailed(f"the patched model fails at call {i}{note}: {type(e).__name__}: {e}",
                              "crash") from None
        expect = (*inputs.shape, self.vocab)
        if shape != expect or tuple(want["shape"]) != expect:
            raise CheckFailed(f"call {i}{note}: output shape {shape}, expected {expect} (changes "
                              "the work)", "work")
        rl = abs(lp - lb) / max(abs(lb), 1e-12)
        self.worst_loss = max(self.worst_loss, rl)
        if not math.isfinite(lp) or rl > rtol:
            raise CheckFailed(f"call {i}{note}: loss {lp:.6f} vs baseline {lb:.6f} "
                              f"(relative {rl:.2e} > {rtol:g})", "loss")
        mine = self.sk.grads(self.patched)
        for name, gb in want["grads"].items():
            gp = mine.get(name)
            if (gb is None) != (gp is None):
                raise CheckFailed(f"call {i}{note}: {name} gets {'no' if gp is None else 'a'} "
                                  f"gradient (baseline: {'none' if gb is None else 'one'}); skips "
                                  "or adds backward work", "gradient")
            if gb is None:
                continue
            r = _rel(gp, gb)
            if not (r <= rtol or float((gp - gb).abs().max()) <= self.atol):
                raise CheckFailed(f"call {i}{note}: gradient of {name} differs by {r:.2e} "
                                  f"(relative, fp32; tolerance {rtol:g})", "gradient")
            self.worst_grad = max(self.worst_grad, r)


def _forward_backward(model, inputs, targets, aux_w) -> tuple[float, tuple[int, ...]]:
    logits, aux = model(inputs)
    loss = _loss.training_loss(logits, targets, aux, aux_w)
    loss.backward()
    return float(loss.detach()), tuple(logits.shape)


# ---- training run -------------------------------------------------------------------------
def verification_spec(spec: TaskSpec) -> TaskSpec:
    """The task with its loss reference stretched over every timed step."""
    t = spec.timing
    steps = max(t.warmup_steps + t.measured_steps, spec.loss_reference.steps)
    return replace(spec, loss_reference=replace(spec.loss_reference, steps=steps))


def train_trace(workspace: str, spec: TaskSpec, config: dict[str, Any],
                guard=None) -> dict[str, Any]:
    """The harness's own ``train_worker`` on ``workspace``, with the state checksum after the
    last step; ``guard()`` runs at every step boundary (the candidate's integrity check)."""
    from infrarsi.harness import train_worker

    return train_worker({"task": spec.to_dict(), "config": dict(config), "workspace": workspace,
                         "capacity_bytes": None, "state_checksum": True, "step_guard": guard})


# Parameters and optimizer state after the last step, relative to the baseline's (sketch
# distance). Same config, world size and fp32 on both sides: honest patches differ by summation
# order only (measured below 1e-4 after the catalog's runs, see tests/test_adversarial.py); one
# skipped update moves a parameter by ~lr / rms(weights), ~1e-2 here.
CHECKSUM_RTOL = 1e-3


def compare_checksums(base: dict[str, list[float]], patched: dict[str, list[float]],
                      rtol: float = CHECKSUM_RTOL) -> tuple[str | None, float]:
    """Compare two ``state_checksum`` results: the problem (naming the class) and the worst
    relative difference."""
    if set(base) != set(patched):
        diff = sorted(set(base) ^ set(patched))[:4]
        return (f"the parameters or optimizer state after the last step differ in kind from the "
                f"baseline's ({diff})"), math.inf
    worst, where = 0.0, ""
    for k, b in base.items():
        a = patched[k]
        num = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))
        den = math.sqrt(sum(y * y for y in b))
        r = num / den if den > 0 else (0.0 if num == 0 else math.inf)
        if not math.isfinite(r) or r > worst:
            worst, where = r, k
    if not math.isfinite(worst) or worst > rtol:
        return (f"work skipped at the last step(s): after the last step {where} differs from the "
                f"baseline's by {worst:.2e} (relative; tolerance {rtol:g}) although every "
                "recorded loss agrees"), worst
    return None, worst


def compare_traces(base: list[float], patched: list[float], rtol: float) -> tuple[str | None, float]:
    if len(patched) != len(base):
        return f"runs {len(patched)} steps, the baseline {len(base)} (changes the number of steps)", math.inf
    worst = 0.0
    for i, (a, b) in enumerate(zip(patched, base, strict=True)):
        r = abs(a - b) / max(abs(b), 1e-12)
        worst = max(worst, r)
        if not math.isfinite(a) or r > rtol:
            return (f"loss drifted at step {i}: {a:.6f} vs baseline {b:.6f} (relative {r:.2e} > "
                    f"{rtol:g})"), worst
    return None, worst
