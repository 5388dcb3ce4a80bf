"""``infrarsi apply`` on synthetic runs in throwaway git repos: the branch holds exactly the
verified change, the current branch is untouched, and every refusal names what is wrong."""

from __future__ import annotations

import pytest
import yaml
from report_fixture import PATCH_DIFF, git, make_run

from infrarsi.apply import ApplyRefusedError, apply_run
from infrarsi.cli import main


def _state(repo):
    return (git(repo, "rev-parse", "HEAD"), git(repo, "branch", "--show-current"),
            git(repo, "status", "--porcelain"), git(repo, "branch", "--list"))


def test_branch_holds_exactly_the_verified_change(tmp_path):
    run = make_run(tmp_path, "promoted")
    head, current, status, _ = _state(run.repo)
    res = apply_run(run.run_dir, bank_url=run.bank_url)
    # the user's branch, index and tree are untouched; no worktree left behind
    assert _state(run.repo)[:3] == (head, current, status) and status == ""
    assert git(run.repo, "worktree", "list").count("\n") == 1
    assert res.base == head.strip() and res.branch == f"infrarsi/{run.run_id}"
    changed = git(run.repo, "diff", "--name-only", "main", res.branch).split()
    assert sorted(changed) == ["infrarsi/promoted/synth.yaml", "ws/model.py"]
    # the source change is the verified patch, line for line
    diff = git(run.repo, "diff", "main", res.branch, "--", "ws/model.py")
    want = [ln for ln in PATCH_DIFF.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    got = [ln for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    assert got == want
    cfg = yaml.safe_load(git(run.repo, "show", f"{res.branch}:infrarsi/promoted/synth.yaml"))
    assert cfg["changed"] == {"activation_checkpointing": {"from": "none", "to": "full"},
                              "micro_batch_size": {"from": 1, "to": 4}}
    assert cfg["patches_applied"] == ["fused_rmsnorm"] and cfg["run_id"] == run.run_id
    assert cfg["evidence"]["ci95"][0] > 1.03
    assert "--set micro_batch_size=4" in cfg["command"] and "patch:" not in cfg["command"]
    msg = git(run.repo, "log", "-1", "--format=%B", res.branch)
    assert msg.startswith("infrarsi: 1.43x faster training step for synth")
    assert "95% CI [" in msg and "loss_check" in msg and "Step time 181.0 ms -> 126.0 ms" in msg


def test_knob_only_promotion_commits_the_config_alone(tmp_path):
    run = make_run(tmp_path, "knobs")
    res = apply_run(run.run_dir, bank_url=run.bank_url, branch="speedup",
                    config_path="launch/fast.yaml")
    assert git(run.repo, "diff", "--name-only", "main", "speedup").split() == ["launch/fast.yaml"]
    assert res.files == ["launch/fast.yaml"]


def test_dirty_tree_is_refused_naming_the_files(tmp_path):
    run = make_run(tmp_path, "promoted")
    (run.repo / "ws" / "model.py").write_text("# local edit\n")
    (run.repo / "notes.txt").write_text("scratch\n")
    before = _state(run.repo)
    with pytest.raises(ApplyRefusedError) as e:
        apply_run(run.run_dir, bank_url=run.bank_url)
    assert "ws/model.py (modified)" in str(e.value) and "notes.txt (untracked)" in str(e.value)
    assert _state(run.repo) == before  # no branch created


def test_frozen_file_changed_since_contract_is_refused(tmp_path):
    run = make_run(tmp_path, "promoted")
    (run.repo / "ws" / "entry.py").write_text("# changed after init\n")
    git(run.repo, "commit", "-qam", "change the entry point")  # clean tree, changed content
    with pytest.raises(ApplyRefusedError, match=r"workspace/entry\.py .* changed"):
        apply_run(run.run_dir, bank_url=run.bank_url)
    assert "infrarsi/" not in git(run.repo, "branch", "--list")


def test_no_promotion_is_refused_with_the_reason(tmp_path):
    run = make_run(tmp_path, "nothing")
    with pytest.raises(ApplyRefusedError, match="no promotion.*noise floor"):
        apply_run(run.run_dir, bank_url=run.bank_url)


def test_patch_that_no_longer_applies_is_refused(tmp_path):
    run = make_run(tmp_path, "promoted")
    (run.repo / "ws" / "model.py").write_text("def rmsnorm(x, w):\n    return x\n")
    git(run.repo, "commit", "-qam", "rewrite the model")
    with pytest.raises(ApplyRefusedError, match="patch fused_rmsnorm does not apply.*model.py"):
        apply_run(run.run_dir, bank_url=run.bank_url)


def test_existing_branch_is_refused_and_cli_exit_code(tmp_path, capsys):
    run = make_run(tmp_path, "knobs")
    git(run.repo, "branch", "taken")
    assert main(["apply", str(run.run_dir), "--bank-url", run.bank_url, "--branch", "taken"]) == 2  # a refusal is bad input (README, exit codes)
    assert "'taken' already exists" in capsys.readouterr().err
    assert main(["apply", str(run.run_dir), "--bank-url", run.bank_url]) == 0
    out = capsys.readouterr().out
    assert "your current branch was not touched" in out and git(run.repo, "branch", "--show-current").strip() == "main"


def test_promoted_knobs_land_in_the_users_own_settings_file(tmp_path, monkeypatch):
    import json

    import report_fixture as rf

    plain = rf.make_repo

    def repo_with_launch(tmp):  # the user's job reads its settings from ws/job.json
        repo = plain(tmp)
        task = repo / "synth.yaml"
        task.write_text(task.read_text() + "launch:\n  file: job.json\n  keys: "
                        "{micro_batch_size: batch.micro, activation_checkpointing: ckpt}\n")
        (repo / "ws" / "job.json").write_text('{"lr": 0.001, "batch": {"micro": 1}}\n')
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "job settings")
        return repo

    monkeypatch.setattr(rf, "make_repo", repo_with_launch)
    run = rf.make_run(tmp_path, "knobs")
    res = apply_run(run.run_dir, bank_url=run.bank_url, branch="speedup")
    assert "ws/job.json" in res.files
    landed = json.loads(git(run.repo, "show", "speedup:ws/job.json"))
    assert landed == {"lr": 0.001, "batch": {"micro": 4}, "ckpt": "full"}
    assert json.loads((run.repo / "ws" / "job.json").read_text())["batch"]["micro"] == 1
