"""The head-node notebook runs end to end on the CPU workload with a tiny budget (nbclient),
through the Python API (``infrarsi.init/doctor/run/report``), not the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "infrarsi_on_ray_head.ipynb"


@pytest.mark.slow
def test_notebook_runs_all_stages(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    run_dir = tmp_path / "cpu_dense"
    monkeypatch.setenv("INFRARSI_NB_RUN_DIR", str(run_dir))
    monkeypatch.setenv("INFRARSI_NB_BUDGET", "2")
    monkeypatch.setenv("INFRARSI_NB_PAIRS", "2")
    monkeypatch.setenv("INFRARSI_BANK_URL", f"sqlite:///{tmp_path / 'bank.sqlite'}")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "infrarsi.cli" not in code and "main([" not in code
    for stage in ("init", "doctor", "run", "report"):
        assert f"infrarsi.{stage}(" in code
    client = nbclient.NotebookClient(nb, timeout=1200, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "contract" in text and "search trials" in text and "doctor: noise floor" in text
    assert (run_dir / "report" / "report.html").is_file()
    assert text.strip().count("report: ") >= 1
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pngs) >= 3  # best-so-far, time vs memory, and more drawn inline
