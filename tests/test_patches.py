"""The patch pipeline's parts: the strict diff applier, the scope rules, the static scan,
isolated materialization (cached per combination), patch knobs and conflict rules."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _patch_specs import WORKSPACE, tiny_spec

from infrarsi.patches import (
    DiffError,
    Patch,
    Scope,
    apply_patch,
    copy_workspace,
    find_conflicts,
    honest_patches,
    load_catalog,
    materialize,
    new_findings,
    parse_diff,
    patch_knobs,
    patch_rules,
    scan_source,
    tree_digest,
    verify_patch,
    workspace_for,
)
from infrarsi.space import SearchSpace
from infrarsi.workloads import build_torch_space

SCOPE = Scope()
SDPA = next(p for p in honest_patches() if p.id == "sdpa_attention")
MASK = next(p for p in honest_patches() if p.id == "cached_mask_rotary")
BATCHED = next(p for p in honest_patches() if p.id == "moe_batched_dispatch")
NOSYNC = next(p for p in honest_patches() if p.id == "moe_no_host_sync")
BUCKETS = next(p for p in honest_patches() if p.id == "moe_shape_buckets")


@pytest.fixture
def ws(tmp_path) -> Path:
    return copy_workspace(WORKSPACE, tmp_path / "ws")


def _patch(diff: str, pid: str = "t") -> Patch:
    return Patch(pid, diff, origin="test")


# ---- the applier -----------------------------------------------------------------------
def test_apply_edits_only_the_copy(ws):
    before = tree_digest(WORKSPACE)
    assert apply_patch(SDPA, ws, SCOPE) == ["models/layers.py"]
    assert "scaled_dot_product_attention" in (ws / "models/layers.py").read_text()
    assert tree_digest(WORKSPACE) == before  # the user's tree is never touched


def test_hunk_offsets_and_wrong_counts_are_tolerated(ws):
    text = (ws / "models/dense.py").read_text().splitlines()
    line = next(i for i, t in enumerate(text) if "def build_dense" in t) + 1
    diff = (f"--- a/models/dense.py\n+++ b/models/dense.py\n@@ -{line + 7},9 +{line + 7},9 @@\n"
            f" def build_dense(shape: dict) -> DecoderLM:\n+    # built here\n")
    apply_patch(_patch(diff), ws, SCOPE)
    assert "# built here" in (ws / "models/dense.py").read_text()


@pytest.mark.parametrize("diff, fragment", [
    ("--- a/models/dense.py\n+++ b/models/dense.py\n@@ -1,1 +1,1 @@\n-no such line\n+x\n",
     "does not match"),
    ("--- a/models/nothere.py\n+++ b/models/nothere.py\n@@ -1,1 +1,1 @@\n-a\n+b\n",
     "does not exist"),
    ("just some prose, no diff\n", "no file changes"),
    ("--- /dev/null\n+++ b/models/dense.py\n@@ -0,0 +1 @@\n+x\n", "already exists"),
])
def test_bad_diffs_are_refused_and_leave_the_tree_unchanged(ws, diff, fragment):
    before = tree_digest(ws)
    with pytest.raises(DiffError, match=fragment):
        apply_patch(_patch(diff), ws, SCOPE)
    assert tree_digest(ws) == before


def test_a_failing_second_file_writes_nothing(ws):
    good = SDPA.diff
    bad = "--- a/models/moe.py\n+++ b/models/moe.py\n@@ -1 +1 @@\n-not in the file\n+x\n"
    before = tree_digest(ws)
    with pytest.raises(DiffError):
        apply_patch(_patch(good + bad), ws, SCOPE)
    assert tree_digest(ws) == before


def test_new_editable_file_is_allowed(ws):
    apply_patch(_patch("--- /dev/null\n+++ b/models/fast.py\n@@ -0,0 +1 @@\n+X = 1\n"), ws, SCOPE)
    assert (ws / "models/fast.py").read_text() == "X = 1\n"


# ---- scope -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["entry.py", "/etc/passwd", "../x.py", "models/../../x.py",
                                  ".git/config", "models/data.bin", "models\\x.py"])
def test_paths_outside_the_editable_scope_are_refused(ws, path):
    diff = f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+x\n"
    with pytest.raises(DiffError) as e:
        apply_patch(_patch(diff), ws, SCOPE)
    assert e.value.rule == "scope"


def test_writing_through_an_existing_symlink_is_refused(ws, tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text("A = 1\n")
    os.symlink(outside, ws / "models" / "link.py")
    diff = "--- a/models/link.py\n+++ b/models/link.py\n@@ -1 +1 @@\n-A = 1\n+A = 2\n"
    with pytest.raises(DiffError, match="symlink"):
        apply_patch(_patch(diff), ws, SCOPE)
    assert outside.read_text() == "A = 1\n"


# ---- static scan -------------------------------------------------------------------------
@pytest.mark.parametrize("src, rule", [
    ("import time\n", "clock"),
    ("from time import perf_counter\n", "clock"),
    ("import threading\n", "thread"),
    ("from concurrent.futures import ThreadPoolExecutor\n", "executor"),
    ("import torch\ntorch.manual_seed(1)\n", "reseed"),
    ("import torch\nx = torch.zeros(1).to(torch.bfloat16)\n", "precision"),
    ("import torch.nn.functional as F\nF.softmax = None\n", "monkeypatch"),
    ("import torch.distributed as dist\ndist.barrier()\n", "barrier"),
    ("open('x', 'w')\n", "file"),
    ("g = globals()\n", "globals"),
    ("import infrarsi.harness.clock\n", "harness"),
    ("x = (1).__class__\n", "internals"),
    ("def f(:\n", "parse"),
])
def test_static_scan_names_the_rule(src, rule):
    findings = scan_source(src)
    assert findings, src
    assert rule in " ".join(f"{f.rule} {f.detail}" for f in findings)


def test_static_scan_reports_only_new_findings():
    before = "import os\nprint(os.sep)\n"
    assert new_findings(before, before + "x = 1\n") == []
    assert [f.detail for f in new_findings(before, before + "import time\n")] == ["imports time"]


def test_honest_catalog_is_statically_clean():
    for p in honest_patches():
        for fd in parse_diff(p.diff):
            root = copy_workspace(WORKSPACE, Path(os.environ.get("TMPDIR", "/tmp")) / f"sc-{p.id}-{os.getpid()}")
            try:
                apply_patch(p, root, SCOPE)
                text = (root / fd.path).read_text()
                assert new_findings((WORKSPACE / fd.path).read_text(), text) == []
            finally:
                import shutil
                shutil.rmtree(root)


# ---- materialize, knobs, conflicts -------------------------------------------------------
def test_materialize_is_cached_per_combination(tmp_path):
    a = materialize(WORKSPACE, [SDPA], SCOPE, cache=tmp_path)
    b = materialize(WORKSPACE, [SDPA], SCOPE, cache=tmp_path)
    c = materialize(WORKSPACE, [SDPA, BATCHED], SCOPE, cache=tmp_path)
    assert a == b != c
    assert "scaled_dot_product_attention" in (c / "models/layers.py").read_text()
    assert "torch.bmm" in (c / "models/moe.py").read_text()
    assert (WORKSPACE / "models/layers.py").read_text().count("scaled_dot_product") == 0


def test_workspace_for_maps_patch_knobs_to_a_copy(tmp_path):
    verified = [SDPA, BATCHED, NOSYNC]
    assert workspace_for({"patch:sdpa_attention": False}, WORKSPACE, verified, cache=tmp_path) == WORKSPACE
    ws = workspace_for({"micro_batch_size": 2, "patch:sdpa_attention": True,
                        "patch:moe_no_host_sync": True}, WORKSPACE, verified, cache=tmp_path)
    assert ws != WORKSPACE and "counts.detach()" in (ws / "models/moe.py").read_text()


def test_patch_knobs_join_the_space_and_conflicts_become_rules(tmp_path):
    verified = [SDPA, MASK, BATCHED]
    conflicts = find_conflicts(verified, WORKSPACE)
    assert [(a, b) for a, b, _ in conflicts] == [("sdpa_attention", "cached_mask_rotary")]
    base = build_torch_space(tiny_spec("moe"))
    space: SearchSpace = base.with_knobs(patch_knobs(verified), patch_rules(verified, WORKSPACE))
    assert space.knob("patch:sdpa_attention").kind == "bool"
    cfg = space.normalize({**base.defaults(), "patch:moe_batched_dispatch": True})
    assert space.is_legal(cfg)
    bad = {**cfg, "patch:sdpa_attention": True, "patch:cached_mask_rotary": True}
    assert any("do not apply together" in v for v in space.violations(bad))


def test_catalog_metadata_round_trips():
    for e in load_catalog():
        assert Patch.from_dict(e.patch.to_dict()) == e.patch
        assert e.patch.knob == f"patch:{e.patch.id}"


def test_verdict_on_a_combination_of_honest_patches(tmp_path):
    # Two verified patches applied together still compute the same thing.
    combo = Patch("combo", SDPA.diff + "".join(BATCHED.diff), origin="test")
    v = verify_patch(combo, workspace=WORKSPACE, spec=tiny_spec("moe"), isolated=False)
    assert v.accepted, v.reason
    assert set(v.evidence["files"]) == {"models/layers.py", "models/moe.py"}


def test_shape_buckets_patch_feeds_experts_few_shapes_and_computes_the_same(tmp_path):
    import torch

    from infrarsi.harness._workspace import load_entry
    from infrarsi.harness.stats import shape_dict

    spec = tiny_spec("moe")  # 2 layers of 4 experts, top-2
    patched = materialize(WORKSPACE, [BUCKETS], SCOPE, cache=tmp_path)
    x = torch.randint(0, 256, (3, 32))
    outs, rows = [], {}
    for name, ws in (("base", WORKSPACE), ("patched", patched)):
        with load_entry(ws) as entry:
            torch.manual_seed(0)
            model = entry.build_model(shape_dict(spec), {"rank": 0, "world_size": 1})
            seen = rows.setdefault(name, [])
            for blk in model.layers:
                for expert in blk.mlp.experts:
                    expert.register_forward_pre_hook(lambda m, a, seen=seen: seen.append(len(a[0])))
            logits, aux = model(x)
            (logits.float().square().mean() + aux).backward()
            outs.append((logits.detach(), aux.detach(),
                         [p.grad.clone() for p in model.parameters()]))
    # 3 x 32 tokens x top-2 over 4 experts: the unpatched counts vary, the patched are 64s
    assert any(n % 64 for n in rows["base"])
    assert rows["patched"] and all(n % 64 == 0 for n in rows["patched"])
    (l0, a0, g0), (l1, a1, g1) = outs
    assert torch.allclose(l0, l1, atol=1e-6) and torch.allclose(a0, a1)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g0, g1, strict=True))


@pytest.mark.slow
def test_patched_workspace_runs_through_ray_train_and_passes_the_contract(tmp_path, ray_local):
    from conftest import copy_task

    from infrarsi.backends.ray_train import RayTrainBackend
    from infrarsi.contract import Contract, load_task
    from infrarsi.init_stage import init_task
    from infrarsi.trial import TrialStatus

    path = copy_task(tmp_path, "cpu_dense.yaml", **{"timing.measured_steps": 2,
                                                   "timing.warmup_steps": 1})
    contract, cpath, _ = init_task(path)
    spec = load_task(path)
    v = verify_patch(SDPA, workspace=spec.workspace_path(), contract=contract)
    assert v.accepted, v.reason
    ws = workspace_for({"patch:sdpa_attention": True}, spec.workspace_path(), [SDPA],
                       Scope.from_contract(contract), cache=tmp_path / "cache")
    backend = RayTrainBackend(spec, contract=Contract.load(cpath.parent), workspace=ws)
    rec = backend.execute(backend.baseline_config())
    assert rec.status is TrialStatus.OK, rec.error_message
