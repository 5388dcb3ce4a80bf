"""The shipped user-job examples end to end on CPU, through the public API as a user runs them:
init -> doctor -> run (a tiny budget) -> report -> apply, on a git repository of the example."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("example", ["nanogpt", "hf_causal_lm", "nanogpt_loop"])
def test_example_runs_init_doctor_run_report_apply(tmp_path, monkeypatch, example):
    if example == "hf_causal_lm":
        pytest.importorskip("transformers")
    import infrarsi
    from infrarsi.apply._git import ApplyRefusedError

    repo = tmp_path / example
    shutil.copytree(EXAMPLES / example, repo, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run("git init -q && git add -A && git -c user.email=t@t -c user.name=t "
                   "commit -qm job", shell=True, cwd=repo, check=True)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / example
    init = infrarsi.init(repo / "infrarsi.yaml", run_dir=run_dir)
    work = init.contract.work
    assert work.tokens_per_step == 512 and work.shape["num_layers"] == 2
    if example != "nanogpt_loop":  # an own loop's shape is measured by its baseline trial
        assert init.baseline.workload.num_params == work.shape["num_params"]
    infrarsi.doctor(run_dir, repeats=2)
    out = infrarsi.run(run_dir, budget=2, verify_top=1, pairs=3)
    assert out.trials >= 2 and out.verdicts, "the run must end with a verdict"
    verdict = out.verdicts[0]
    assert verdict.reason
    print(f"{example}: verdict promoted={verdict.promoted} speedup={verdict.speedup} "
          f"CI=[{verdict.ci_low}, {verdict.ci_high}] reason={verdict.reason}")
    rep = infrarsi.report(run_dir)
    assert Path(rep.markdown if hasattr(rep, "markdown") else rep.to_dict()["markdown"]).is_file()
    if out.promoted is None:
        with pytest.raises(ApplyRefusedError, match="promoted nothing|nothing"):
            infrarsi.apply(run_dir)
    else:
        branch = infrarsi.apply(run_dir)
        assert branch.files and branch.branch


def test_the_readme_shows_each_examples_glue_whole():
    """Every README block headed ``# examples/<name>/<file>`` is that file, byte for byte (the
    header line aside), and the glue of each example is shown: its YAML, and its adapter or
    the script's lines that call InfraRSI."""
    import re

    readme = (EXAMPLES.parent / "README.md").read_text()
    blocks = re.findall(r"```\w+\n# (examples/\S+)\n(.*?)```", readme, flags=re.S)
    shown = {path: body for path, body in blocks}
    for path, body in shown.items():
        assert body == (EXAMPLES.parent / path).read_text(), f"README's {path} is out of date"
    for name in ("nanogpt", "nanogpt_loop"):
        assert f"examples/{name}/infrarsi.yaml" in shown
    assert "examples/nanogpt/infrarsi_adapter.py" in shown
    script = (EXAMPLES / "nanogpt_loop" / "train.py").read_text()
    calls = [s.strip() for s in script.splitlines() if "infrarsi.prepare(" in s
             or "infrarsi.step(" in s or s.startswith("import infrarsi")]
    assert len(calls) == 3 and all(c in readme for c in calls)
