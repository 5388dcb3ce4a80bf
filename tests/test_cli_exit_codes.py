"""One exit-code policy for every command (the README's "Exit codes" table), and no side
effects from a refused command: 2 bad input (refused, nothing changed), 1 ran and failed,
4 the contract is broken. Fast: every case is refused before a trial runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import copy_task

from infrarsi import cli
from infrarsi.contract import load_task
from infrarsi.contract.contract import lock
from infrarsi.rundir import OUTCOME_FILE, RUN_FILE, write_json


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run folder with a contract locked from a made-up loss trace (no trial run)."""
    spec = load_task(copy_task(tmp_path))
    contract = lock(spec, baseline_config=dict(spec.search.baseline),
                    loss_trace=[7.0] * spec.loss_reference.steps, model_stats={})
    contract.save(tmp_path / "run")
    return tmp_path / "run"


def _frozen_edit(run_dir: Path) -> Path:
    """Change a frozen file of the run's workspace (what a contract forbids)."""
    entry = run_dir.parent / "ws" / "entry.py"
    entry.write_text(entry.read_text() + "\n# edited\n")
    return entry


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(autouse=True)
def _no_default_bank(monkeypatch, tmp_path):
    monkeypatch.setenv("INFRARSI_BANK_URL", f"sqlite:///{tmp_path / 'env-bank.sqlite'}")
    monkeypatch.chdir(tmp_path)  # no LATEST pointer here


def test_init_and_trial(tmp_path):
    assert cli.main(["init", str(tmp_path / "missing.yaml")]) == 2
    assert cli.main(["trial", str(tmp_path / "missing.yaml")]) == 2
    task = copy_task(tmp_path)
    assert cli.main(["trial", str(task), "--set", "no_such_knob=1"]) == 2


def test_run(run_dir, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'bank.sqlite'}"
    before = _files(tmp_path)
    assert cli.main(["run", "--budget", "2", "--pairs", "2", "--run-dir", str(run_dir),
                     "--bank-url", url]) == 2
    assert "--pairs 3 or more" in capsys.readouterr().err
    assert cli.main(["run", "--budget", "0", "--run-dir", str(run_dir), "--bank-url", url]) == 2
    assert cli.main(["run", "--budget", "2", "--run-dir", str(tmp_path / "nowhere")]) == 2
    assert cli.main(["run", "--budget", "2"]) == 2  # no run given, none initialized here
    assert _files(tmp_path) == before  # refused: no bank file, no run file
    # a finished run resumed again: says so, exit 0
    write_json(run_dir / RUN_FILE, {"run_id": "r1"})
    write_json(run_dir / OUTCOME_FILE, {"run_id": "r1", "trials": 3, "best": None,
                                        "verdicts": []})
    assert cli.main(["run", "--budget", "2", "--resume", "--run-dir", str(run_dir)]) == 0
    assert "is finished: nothing to resume" in capsys.readouterr().out
    (run_dir / OUTCOME_FILE).unlink()
    entry = _frozen_edit(run_dir)
    assert cli.main(["run", "--budget", "2", "--run-dir", str(run_dir), "--bank-url", url]) == 4
    assert entry.name in capsys.readouterr().err


def test_doctor(run_dir, tmp_path, capsys):
    assert cli.main(["doctor", "--run-dir", str(tmp_path / "nowhere")]) == 2
    _frozen_edit(run_dir)
    assert cli.main(["doctor", "--run-dir", str(run_dir)]) == 4
    assert "entry.py" in capsys.readouterr().err


def test_report_and_apply(tmp_path):
    assert cli.main(["report", str(tmp_path / "nowhere")]) == 2
    assert cli.main(["apply", str(tmp_path / "nowhere")]) == 2


def test_bank_bad_input_exits_2_and_a_failed_import_creates_no_bank(tmp_path, capsys):
    target = tmp_path / "new-bank.sqlite"
    url = f"sqlite:///{target}"
    assert cli.main(["bank", "import", str(tmp_path / "no-bundle"), "--url", url]) == 2
    assert "manifest.json is missing" in capsys.readouterr().err
    assert not target.exists()
    assert cli.main(["bank", "stats", "--url", "mysql://nobody@nowhere/db"]) == 2
    assert cli.main(["bank", "stats", "--url", "sqlite://"]) == 2
    assert cli.main(["bank", "query", "--url", url, "--near", "no-such-run"]) == 2


def test_a_bank_chosen_through_the_environment_says_when_it_receives_the_seed(tmp_path, capsys):
    assert cli.main(["bank", "stats"]) == 0  # $INFRARSI_BANK_URL (the fixture): a new bank
    err = capsys.readouterr().err
    assert "imported the built-in seed experience" in err and "env-bank.sqlite" in err
    assert cli.main(["bank", "stats"]) == 0  # once per bank
    assert "seed" not in capsys.readouterr().err
