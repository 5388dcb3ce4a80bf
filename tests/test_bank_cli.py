"""`infrarsi bank` subcommands end to end through the real CLI entry point."""

from __future__ import annotations

import json

from bank_conformance import ok_trial, oom_trial, start

from infrarsi.bank import ExperienceBank
from infrarsi.cli import main


def test_bank_cli_stats_query_export_import_upgrade(tmp_path, capsys):
    url, url2 = f"sqlite:///{tmp_path / 'a.sqlite'}", f"sqlite:///{tmp_path / 'b.sqlite'}"
    bank = ExperienceBank.open(url)
    rid = start(bank)
    bank.record_trials(rid, [ok_trial("1", 1, 0.2), oom_trial("2", 64)])
    bank.record_finding(rid, "micro_batch_size", 64, {}, {"oom": True}, True)
    bank.close()
    assert main(["bank", "upgrade", "--url", url]) == 0
    assert "already at schema v1" in capsys.readouterr().out
    assert main(["bank", "stats", "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tables"]["trials"] == 2
    assert main(["bank", "query", "--url", url, "--run", rid, "--status", "oom"]) == 0
    assert "oom" in capsys.readouterr().out
    assert main(["bank", "query", "--url", url, "--knob", "micro_batch_size"]) == 0
    assert "[flagged]" in capsys.readouterr().out
    assert main(["bank", "export", str(tmp_path / "bundle"), "--url", url]) == 0
    assert main(["bank", "import", str(tmp_path / "bundle"), "--url", url2, "--json"]) == 0
    capsys.readouterr()
    assert main(["bank", "query", "--url", url2, "--near", rid, "--json"]) == 0
    assert [n["record"]["trial_id"] for n in json.loads(capsys.readouterr().out)] == ["1", "2"]
    (tmp_path / "bundle" / "trials.parquet").write_bytes(b"garbage")
    assert main(["bank", "import", str(tmp_path / "bundle"), "--url", url2]) == 2  # a corrupt bundle is bad input
    assert "checksum mismatch" in capsys.readouterr().err
