"""The workload interface for a user's own job (``infrarsi.harness.workload``): the nanoGPT
example's model, data and loss run under the harness; every mistake a new user makes is named
with its fix; the contract catches a patch that changes the user's loss or data."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from infrarsi.backends.ray_train._runner import _materialize, read_workspace
from infrarsi.contract import lock
from infrarsi.contract.spec import TaskSpec, load_task
from infrarsi.errors import ConfigError, FrozenFileChangedError, WorkloadError
from infrarsi.harness import train_worker
from infrarsi.harness.stats import adapter_stats
from infrarsi.workloads import build_torch_space

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NANOGPT = EXAMPLES / "nanogpt"


def _copy_example(tmp_path: Path, name: str = "nanogpt") -> Path:
    dest = tmp_path / name
    shutil.copytree(EXAMPLES / name, dest, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    return dest


def _run(spec: TaskSpec, workspace: Path | None = None, **knobs) -> dict:
    space = build_torch_space(spec)
    config = space.normalize({**space.defaults(), "num_workers": 1, **knobs})
    return train_worker({"task": spec.to_dict(), "config": config,
                         "workspace": str(workspace or spec.workspace_path()),
                         "capacity_bytes": None})


def _user_model_facts() -> tuple[int, int]:
    """(parameters, vocabulary) of the example's GPT, counted with the user's own code."""
    spec = importlib.util.spec_from_file_location("_nanogpt_model", NANOGPT / "model.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_nanogpt_model"] = mod
    try:
        spec.loader.exec_module(mod)
        vocab = len(set((NANOGPT / "input.txt").read_text()))
        model = mod.GPT(mod.GPTConfig(vocab_size=vocab))
        return sum(p.numel() for p in model.parameters()), vocab
    finally:
        del sys.modules["_nanogpt_model"]


def test_nanogpt_runs_under_the_harness_with_its_own_data_loss_and_shape():
    spec = load_task(NANOGPT / "infrarsi.yaml")
    assert spec.workload.adapter and spec.workload.shape is None
    a = _run(spec)
    b = _run(spec, micro_batch_size=4, activation_checkpointing="full")
    # The global batch of a step does not depend on the micro-batch: same losses.
    assert a["loss_trace"] == pytest.approx(b["loss_trace"], rel=1e-5)
    assert a["loss_trace"][-1] < a["loss_trace"][0]
    assert a["tokens_per_step"] == 8 * 64  # counted by the user's tokens(batch)
    params, vocab = _user_model_facts()
    assert a["num_params"] == params  # measured, not a formula
    assert a["shape"] == {"num_params": params, "num_layers": 2, "hidden_size": 64,
                          "num_heads": 4, "vocab_size": vocab, "seq_len": 64}


def test_entry_contract_read_before_any_trial_is_stable():
    spec = load_task(NANOGPT / "infrarsi.yaml")
    a, b = adapter_stats(spec), adapter_stats(spec)
    assert a == b  # the bank's signature of a user model is stable across runs
    assert a["blocks"] == "Block" and a["tokens_per_step"] == 512 and a["num_layers"] == 2


def test_cpu_capacity_defaults_from_the_machine_and_rotary_rule_is_optional():
    spec = load_task(NANOGPT / "infrarsi.yaml")
    assert spec.hardware.memory_capacity_gib and spec.hardware.memory_capacity_gib > 0
    shape = dict(vocab_size=64, hidden_size=60, num_layers=2, num_heads=4, ffn_hidden_size=64)
    task = {"name": "t", "hardware": {"device": "cpu"},
            "workload": {"workspace": ".", "global_batch_size": 4, "seq_len": 8, "shape": shape}}
    with pytest.raises(ConfigError, match="rotary: false"):
        TaskSpec.from_dict(task)  # head dim 15 is odd
    task["workload"]["shape"] = {**shape, "rotary": False}
    assert TaskSpec.from_dict(task).workload.shape.rotary is False


def test_any_workspace_file_type_is_shipped(tmp_path):
    ws = _copy_example(tmp_path)
    (ws / "vocab.bin").write_bytes(bytes(range(256)))
    files = read_workspace(ws)
    assert {"input.txt", "vocab.bin", "model.py", "train.py"} <= set(files)
    out = Path(_materialize(files))
    assert (out / "vocab.bin").read_bytes() == bytes(range(256))
    assert (out / "input.txt").read_text() == (ws / "input.txt").read_text()


# ---- errors a new user meets: each names the problem and the fix ---------------------------
GOOD = {
    "head": "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n",
    "build_model": "def build_model():\n    torch.manual_seed(0)\n"
                   "    return nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))\n",
    "batches": "def batches(ctx):\n    for s in range(10**6):\n"
               "        x = torch.randint(16, (ctx.global_batch_size, 5), generator=ctx.generator(s))\n"
               "        yield from ctx.shard((x, x))\n",
    "loss": "def loss(model, batch):\n    x, y = batch\n"
            "    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())\n",
    "tokens": "def tokens(batch):\n    return batch[1].numel()\n",
}


def _adapter(tmp_path: Path, **replace: str) -> TaskSpec:
    parts = {**GOOD, **replace}
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "adapter.py").write_text("\n".join(textwrap.dedent(v) for v in parts.values() if v))
    return TaskSpec.from_dict({
        "name": "user", "hardware": {"device": "cpu", "max_workers": 1},
        "workload": {"workspace": str(ws), "entry": "adapter.py", "global_batch_size": 4},
        "scope": {"frozen": ["adapter.py"]},
        "timing": {"warmup_steps": 1, "measured_steps": 2}, "loss_reference": {"steps": 2}})


def test_the_good_adapter_passes(tmp_path):
    spec = _adapter(tmp_path)
    assert adapter_stats(spec)["tokens_per_step"] == 20
    assert len(_run(spec)["loss_trace"]) == 4


@pytest.mark.parametrize("replace, fix", [
    ({"tokens": ""}, re.escape("does not define tokens: add `def tokens(batch)")),
    ({"loss": "def loss(model):\n    return model\n"},
     re.escape("loss(model) takes the wrong arguments: it must be `def loss(model, batch)")),
    ({"build_model": "def build_model():\n    return 3\n"}, "return your model instance"),
    ({"loss": "def loss(model, batch):\n    return F.cross_entropy(model(batch), batch[1])\n"},
     "does not return what your loss expects.*call the model in loss\\(\\) the way your own "
     "training loop does"),
    ({"loss": "def loss(model, batch):\n    x, y = batch\n    return F.cross_entropy("
              "model(x).flatten(0, 1), y.flatten(), reduction='none')\n"},
     "must return a scalar tensor .*\\.mean\\(\\)"),
    ({"batches": "def batches(ctx):\n    while True:\n        x = torch.randint(16, (3, 5))\n"
                 "        yield from ctx.shard((x, x))\n"},
     "global batch of 3 rows, the task locks global_batch_size 4; draw exactly "
     "ctx.global_batch_size rows"),
    ({"batches": "def batches(ctx):\n    while True:\n        x = torch.randint(16, (2, 5))\n"
                 "        yield x, x\n"},
     "micro-batch of 2 rows, but the baseline's micro_batch_size is 1.*ctx.micro_batch_size"),
    ({"batches": "def batches(ctx):\n    while True:\n"
                 "        x = torch.randint(16, (ctx.global_batch_size, 5))\n"
                 "        yield from ctx.shard((x, x))\n"},
     "different data each time.*ctx.generator\\(step\\)"),
    ({"tokens": "def tokens(batch):\n    return 0\n"},
     "must return a positive int .*e.g. `return batch\\[1\\].numel\\(\\)`"),
    ({"tokens": GOOD["tokens"] + "def blocks(model):\n    return model[0]\n"},
     "blocks\\(model\\) returned a Embedding; return the nn.ModuleList .*e.g. `return model.h`"),
])
def test_adapter_mistakes_are_named_with_the_fix_before_any_trial(tmp_path, replace, fix):
    spec = _adapter(tmp_path, **replace)
    with pytest.raises(WorkloadError, match=fix):
        adapter_stats(spec)


def test_a_non_scalar_loss_in_a_trial_is_named_with_the_fix(tmp_path):
    spec = _adapter(tmp_path, loss="def loss(model, batch):\n    x, y = batch\n"
                    "    return F.cross_entropy(model(x).flatten(0, 1), y.flatten(), "
                    "reduction='none')\n")
    with pytest.raises(WorkloadError, match="must return a scalar tensor .*reduce it with "
                       "\\.mean\\(\\)"):
        _run(spec)


def test_an_optimizer_hook_that_returns_no_optimizer_is_named_with_the_fix(tmp_path):
    spec = _adapter(tmp_path, tokens=GOOD["tokens"] + "def optimizer(model, impl):\n"
                    "    return model.parameters()\n")
    with pytest.raises(WorkloadError, match="optimizer\\(model, impl\\) returned a generator; "
                       "return a torch.optim.Optimizer, e.g. `torch.optim.AdamW"):
        _run(spec)


def test_checkpointing_a_model_without_blocks_names_the_hook(tmp_path):
    spec = _adapter(tmp_path, build_model="def build_model():\n"
                    "    return nn.ModuleDict({'e': nn.Embedding(16, 8), 'o': nn.Linear(8, 16)})\n",
                    loss="def loss(model, batch):\n    x, y = batch\n    return F.cross_entropy("
                    "model['o'](model['e'](x)).flatten(0, 1), y.flatten())\n")
    with pytest.raises(WorkloadError, match="define `def blocks\\(model\\)"):
        _run(spec, activation_checkpointing="full")


def test_a_script_without_the_interface_is_told_what_to_define(tmp_path):
    spec = _adapter(tmp_path, build_model="", batches="", loss="", tokens="x = 1\n")
    with pytest.raises(WorkloadError, match="define build_model\\(\\), batches\\(ctx\\)"):
        adapter_stats(spec)


# ---- the contract catches a patch to the user's loss or data -------------------------------
def _locked(tmp_path: Path):
    ws = _copy_example(tmp_path)
    spec = load_task(ws / "infrarsi.yaml")
    base = _run(spec)
    contract = lock(spec, baseline_config={}, loss_trace=base["loss_trace"],
                    model_stats={"shape": base["shape"], "num_params": base["num_params"],
                                 "tokens_per_step": base["tokens_per_step"]})
    return ws, spec, contract


def test_contract_catches_a_patch_to_the_users_data_or_loss_files(tmp_path):
    ws, spec, contract = _locked(tmp_path)
    assert contract.work.tokens_per_step == 512 and contract.work.shape["num_layers"] == 2
    assert {"workspace/train.py", "workspace/input.txt",
            "workspace/infrarsi_adapter.py"} <= set(contract.frozen_files)
    contract.verify_frozen()
    train = ws / "train.py"
    train.write_text(train.read_text().replace("data[i + 1:i + 1 + BLOCK_SIZE]",
                                               "data[i:i + BLOCK_SIZE]"))
    with pytest.raises(FrozenFileChangedError, match="workspace/train.py"):
        contract.verify_frozen()


def test_contract_rejects_an_editable_model_patch_that_changes_the_loss(tmp_path):
    ws, spec, contract = _locked(tmp_path)
    model = ws / "model.py"
    # A patch to the editable model file that changes the loss the model computes.
    text = model.read_text()
    assert "targets.flatten())" in text
    model.write_text(text.replace("targets.flatten())", "targets.flatten(), label_smoothing=0.1)"))
    contract.verify_frozen()  # model.py is editable: only the loss reference can catch this
    out = _run(spec, workspace=ws)
    assert contract.check_work(out["tokens_per_step"]) is None
    assert "loss drifted" in contract.check_loss(out["loss_trace"], "fp32")


# ---- the second way in: the user's own loop with infrarsi.prepare + infrarsi.step ----------
LOOP = EXAMPLES / "nanogpt_loop"


def test_own_loop_script_runs_with_the_harness_owning_clock_accumulation_and_loss():
    spec = load_task(LOOP / "infrarsi.yaml")
    assert spec.workload.script == "train.py"
    a = _run(spec)
    b = _run(spec, micro_batch_size=2, activation_checkpointing="full", optimizer_impl="for_loop")
    # micro-batching by the prepared loader and optimizer keeps the update of the global batch
    assert a["loss_trace"] == pytest.approx(b["loss_trace"], rel=1e-5)
    assert a["loss_trace"][-1] < a["loss_trace"][0]
    assert a["tokens_per_step"] == 512 and len(a["step_times_s"]) == 3
    assert a["shape"]["num_layers"] == 2 and a["shape"]["num_params"] == _user_model_facts()[0]


def test_prepare_and_step_do_nothing_outside_a_trial():
    import torch

    import infrarsi

    model, opt, loader = torch.nn.Linear(2, 2), None, [1, 2]
    assert infrarsi.prepare(model, opt, loader) == (model, opt, loader)
    assert infrarsi.step(torch.tensor(1.0), tokens=4) is None


def test_an_own_loop_that_ends_too_soon_is_told_to_call_step(tmp_path):
    ws = _copy_example(tmp_path, "nanogpt_loop")
    yaml_text = (ws / "infrarsi.yaml").read_text().replace('script_args: [--batch-size, "8"]',
                                                          'script_args: [--steps, "2"]')
    (ws / "infrarsi.yaml").write_text(yaml_text)
    with pytest.raises(WorkloadError, match="ended after 2 optimizer steps.*infrarsi.step"):
        _run(load_task(ws / "infrarsi.yaml"))


def test_own_loop_contract_catches_a_patch_to_the_users_data(tmp_path):
    ws = _copy_example(tmp_path, "nanogpt_loop")
    spec = load_task(ws / "infrarsi.yaml")
    base = _run(spec)
    contract = lock(spec, baseline_config={}, loss_trace=base["loss_trace"],
                    model_stats={"shape": base["shape"], "tokens_per_step": 512})
    (ws / "input.txt").write_text((ws / "input.txt").read_text().upper())
    with pytest.raises(FrozenFileChangedError, match="workspace/input.txt"):
        contract.verify_frozen()


def test_a_run_dir_given_to_init_is_followed_by_later_stages(tmp_path, monkeypatch):
    from infrarsi.rundir import CONTRACT_FILE, point_latest, resolve_run_dir

    run_dir = tmp_path / "elsewhere" / "myrun"
    run_dir.mkdir(parents=True)
    (run_dir / CONTRACT_FILE).write_text("{}")
    monkeypatch.chdir(tmp_path)
    point_latest(run_dir)
    assert resolve_run_dir(None) == run_dir.resolve()


def test_init_from_script_scaffolds_an_adapter_and_yaml_with_todos(tmp_path):
    from infrarsi.cli import main

    script = tmp_path / "job" / "train.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent("""
        import argparse
        import torch
        from torch import nn

        class TinyLM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(16, 8)

        def get_batch(n):
            return torch.randint(16, (n, 4))

        def compute_loss(model, batch):
            return model.emb(batch).mean()

        if __name__ == "__main__":
            p = argparse.ArgumentParser()
            p.add_argument("--batch-size", type=int, default=12)
            model = TinyLM()
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    """))
    assert main(["init", "--from-script", str(script)]) == 0
    adapter = (script.parent / "infrarsi_adapter.py").read_text()
    assert "from .train import TinyLM, compute_loss, get_batch" in adapter
    assert "return TinyLM()" in adapter and "TODO" in adapter
    assert "torch.optim.AdamW(model.parameters(), lr=0.0003, **impl)" in adapter
    compile(adapter, "infrarsi_adapter.py", "exec")
    spec = load_task(script.parent / "infrarsi.yaml")
    assert spec.workload.global_batch_size == 12 and spec.workload.adapter
    with pytest.raises(NotImplementedError, match="TODO: yield from ctx.shard"):
        adapter_stats(spec)
    assert main(["init", "--from-script", str(script)]) == 2  # exists: refused, not overwritten


def test_init_from_script_writes_an_optimizer_hook_that_runs(tmp_path):
    """The scaffolded optimizer imports the script's constants it reads, takes the parameters
    from ``model`` whatever the script named its model, and marks what only the script's run
    knows (``args``) as a TODO."""
    import torch

    from infrarsi.scaffold import scaffold

    job = tmp_path / "job"
    shutil.copytree(NANOGPT, job, ignore=shutil.ignore_patterns("__pycache__", "infrarsi*"))
    adapter, _ = scaffold(job / "train.py")
    text = adapter.read_text()
    assert "from .train import LEARNING_RATE, get_batch" in text
    assert "torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, **impl)" in text
    (job / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib

        mod = importlib.import_module("job.infrarsi_adapter")
        opt = mod.optimizer(torch.nn.Linear(2, 2), {"foreach": False})
        assert opt.defaults["lr"] == 1e-3 and opt.defaults["foreach"] is False
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "job" or n.startswith("job.")]:
            del sys.modules[name]
    loop = tmp_path / "loop"
    loop.mkdir()
    (loop / "train.py").write_text("from torch import optim\n"
                                   "opt = optim.SGD(net.parameters(), lr=args.lr)\n")
    text = scaffold(loop / "train.py")[0].read_text()
    assert ("return torch.optim.SGD(model.parameters(), lr=args.lr, **impl)  # TODO: args: "
            "your script's values here") in text


def test_prepare_outside_a_trial_applies_the_promoted_settings_file(tmp_path):
    import torch

    import infrarsi

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

        def forward(self, x):
            for m in self.layers:
                x = m(x)
            return x

    settings = tmp_path / "infrarsi.json"
    settings.write_text('{"precision": "bf16", "activation_checkpointing": "full", '
                        '"optimizer_impl": "for_loop", "micro_batch_size": 2}')
    net = Net()
    opt = torch.optim.AdamW(net.parameters())
    model, opt2, _ = infrarsi.prepare(net, opt, None, settings=settings)
    assert model(torch.randn(3, 4)).dtype == torch.bfloat16  # autocast on the forward
    assert "CheckpointWrapper" in type(model.layers[0]).__name__
    assert opt2 is opt and opt.param_groups[0]["foreach"] is False
    plain = Net()
    assert infrarsi.prepare(plain, None, None, settings=tmp_path / "absent.json")[0] is plain


# ---- errors in an own loop: each names the problem and the fix (in process, no Ray) --------
LOOP_SCRIPT = """
import torch
import infrarsi

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = ((x, x) for x in (torch.randint(16, (ROWS, 5)) for _ in range(10)))
if PREPARE:
    model, optimizer, loader = infrarsi.prepare(model, optimizer, loader)
for x, y in loader:
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten(),
                                             reduction=REDUCTION)
    loss.mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    infrarsi.step(LOSS, tokens=y.numel())
"""


def _own_loop(tmp_path: Path, *, rows: int = 4, prepare: bool = True,
              reduction: str = "mean", loss: str = "loss") -> None:
    """Run a small own-loop script as a trial runs it (``run_script`` with a session), in
    this process: global batch 4, micro-batch 2, three optimizer steps."""
    import torch

    from infrarsi.harness.own_loop import Session, run_script
    from infrarsi.harness.workload import DataContext

    script = (LOOP_SCRIPT.replace("ROWS", str(rows)).replace("PREPARE", str(prepare))
              .replace("REDUCTION", repr(reduction)).replace("LOSS", loss))
    (tmp_path / "train.py").write_text(script)
    config = {"activation_checkpointing": "none", "compile": "off", "data_parallel": "ddp",
              "precision": "fp32", "optimizer_impl": "foreach", "micro_batch_size": 2}
    session = Session(config=config, device=torch.device("cpu"),
                      ctx=DataContext(0, 1, 2, 4, 0), accum=2, total_steps=3,
                      on_step=lambda i: None)
    run_script(tmp_path, "train.py", [], session)


def test_the_small_own_loop_runs(tmp_path):
    _own_loop(tmp_path)  # the baseline of the cases below: no error


@pytest.mark.parametrize("kw, fix", [
    ({"prepare": False}, "never called infrarsi.prepare.*call it once before your training loop"),
    ({"rows": 3}, "yielded a batch of 3 rows, but the task locks workload.global_batch_size 4: "
                  "give prepare\\(\\) a loader of whole global batches.*workload.script_args"),
    ({"reduction": "none"}, re.escape("got a tensor of shape [10]; loss must be the scalar loss "
                                      "tensor of the micro-batch: reduce it to the micro-batch's "
                                      "mean loss with .mean()")),
    ({"loss": "loss.item()"}, re.escape("got a float; loss must be the scalar loss tensor of the "
                                        "micro-batch: pass the tensor `loss`, not `loss.item()`")),
])
def test_own_loop_mistakes_are_named_with_the_fix(tmp_path, kw, fix):
    with pytest.raises(WorkloadError, match=fix):
        _own_loop(tmp_path, **kw)


@pytest.mark.parametrize("status, kind, fix, not_fix", [
    ("error", "crash", "Fix what the error above names, or change search.baseline",
     "smaller micro_batch_size"),
    ("oom", None, "smaller micro_batch_size, activation_checkpointing: full", "Fix what"),
])
def test_a_baseline_that_does_not_run_gets_the_fix_that_fits(status, kind, fix, not_fix):
    """init's refusal: memory savers only for an out-of-memory baseline, never for a crash in
    the user's code (the wrong advice a new user was given)."""
    from infrarsi.backends.ray_train.backend import hardware_fingerprint, workload_signature
    from infrarsi.init_stage import baseline_failed
    from infrarsi.trial import TrialRecord

    spec = load_task(NANOGPT / "infrarsi.yaml")
    record = TrialRecord.from_dict({
        "trial_id": "init-baseline", "config": {}, "status": status, "error_kind": kind,
        "backend": "ray_train", "workload": workload_signature(spec).to_dict(),
        "hardware": hardware_fingerprint(spec).to_dict(),
        "error_message": "ImportError: No module named 'tiktoken'"})
    message = baseline_failed(record, {"micro_batch_size": 1}, spec)
    assert fix in message and not_fix not in message and "re-run `infrarsi init`" in message
