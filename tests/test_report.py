"""The report stage on synthetic runs (no Ray): sections, plots, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from report_fixture import make_run

from infrarsi.cli import main
from infrarsi.report import ReportInputError, build_report

SECTIONS = ["Promoted change", "Patches", "Plots", "Verification", "Trial ledger",
            "Priors the run corrected", "Doctor&#x27;s baseline", "Audit"]
PLOTS = ["best_so_far", "time_vs_memory", "memory_calibration", "prior_vs_measured", "phase_profile"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = {}
    for kind in ("promoted", "nothing", "oom", "partial"):
        run = make_run(tmp_path_factory.mktemp(kind), kind)
        out[kind] = (run, build_report(run.run_dir, bank_url=run.bank_url))
    return out


def test_promoted_report_has_every_section_and_plot(reports):
    run, res = reports["promoted"]
    html, md = res.html.read_text(), res.markdown.read_text()
    assert "Promoted: 1.4" in md and "95% CI [" in md
    for s in SECTIONS:
        assert f">{s}<" in html, s
    # self-contained: every image is embedded, nothing is fetched
    srcs = re.findall(r"src='([^']*)'", html)
    assert len(srcs) == len(PLOTS) and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert sorted(res.plots) == sorted(PLOTS)
    assert all(p.stat().st_size > 5000 for p in res.plots.values())
    for name in PLOTS:
        assert f"plots/{name}.png" in md
    # headline figures before/after, MFU labelled with its peak
    assert "181.0 ms" in md and "126.0 ms" in md and "measured CPU matmul peak" in md
    assert "60.0 MiB" in md and "93.0 MiB" in md
    # promoted config: only changed knobs; the patch with files, evidence and diff
    assert "| `micro_batch_size` | 1 | 4 |" in md and "`precision`" not in md.split("## Patches")[0]
    assert "fused_rmsnorm" in md and "torch.rsqrt" in md and "loss_check" in md
    # ledger: every trial, origins, failure cost and OOM share
    for tid in ("t0", "t2", "t4", "t7", "verify0-A2", "verify0-B2"):
        assert f"`{tid}`" in md
    assert "error (compile)" in md and "> 128 MiB (censored)" in md
    assert "Failed trials: 3 costing **43 device-s**" in md and "OOM: 2 trial(s), 30% of the failed cost" in md
    # audit: frozen files re-checked, fingerprints, reproduce commands
    assert re.search(r"All \d+ frozen files re-hashed now match the contract", md)
    assert run.run_id in md and "torch 2.5.0" in md
    assert "infrarsi trial" in md and "--set micro_batch_size=4" in md
    assert res.summary.splitlines()[-1] == f"report: {res.html.resolve()}"


def test_nothing_promoted_says_noise_floor(reports):
    _, res = reports["nothing"]
    md = res.markdown.read_text()
    assert "Nothing promoted" in md and "nothing beat the noise floor" in md
    assert "best candidate (not promoted)" in md
    assert "Nothing was promoted, so there is nothing to apply." in md
    assert "Nothing promoted" in res.summary


def test_everything_oom_says_so(reports):
    _, res = reports["oom"]
    md = res.markdown.read_text()
    assert "every candidate ran out of memory (3/3 OOM" in md
    assert "time_vs_memory" in res.plots  # OOMs drawn as censored marks


def test_partial_run_is_marked(reports):
    _, res = reports["partial"]
    md = res.markdown.read_text()
    assert md.startswith("# InfraRSI report — synth (partial)")
    assert "Partial run" in md and "infrarsi run --resume" in md
    assert "`t6`" in md  # what exists is reported


def test_changed_frozen_file_is_flagged(tmp_path):
    run = make_run(tmp_path, "knobs")
    (run.repo / "ws" / "entry.py").write_text("# tampered\n")
    md = build_report(run.run_dir, bank_url=run.bank_url).markdown.read_text()
    assert "frozen file(s) differ from the contract: `workspace/entry.py` CHANGED" in md


def test_missing_bank_and_missing_run(tmp_path, monkeypatch):
    monkeypatch.setenv("INFRARSI_BANK_URL", f"sqlite:///{tmp_path / 'none.sqlite'}")
    run = make_run(tmp_path, "knobs")
    with pytest.raises(ReportInputError, match="--bank-url"):
        build_report(run.run_dir, bank_url=f"sqlite:///{tmp_path / 'gone.sqlite'}")
    (run.run_dir / "run.json").unlink()
    with pytest.raises(ReportInputError, match="infrarsi run --budget"):
        build_report(run.run_dir, bank_url=run.bank_url)
    with pytest.raises(ReportInputError, match="infrarsi init"):
        build_report(tmp_path / "nowhere")


def test_cli_report_prints_summary_and_path(tmp_path, capsys, monkeypatch):
    run = make_run(tmp_path, "knobs")
    assert main(["report", str(run.run_dir), "--bank-url", run.bank_url]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("Promoted:") and out[-1].endswith("report/report.html")
    assert Path(out[-1].split("report: ")[1]).is_file()
    monkeypatch.setenv("INFRARSI_BANK_URL", f"sqlite:///{tmp_path / 'none.sqlite'}")
    assert main(["report", str(run.run_dir), "--bank-url", f"sqlite:///{tmp_path}/x.sqlite"]) == 2
    assert "--bank-url" in capsys.readouterr().err
