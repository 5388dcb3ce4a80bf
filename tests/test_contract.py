from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TASKS, copy_task

from infrarsi.contract import Contract, TaskSpec, frozen_paths, load_task, lock
from infrarsi.errors import ConfigError, ContractError, FrozenFileChangedError, IllegalConfigError
from infrarsi.workloads import build_torch_space


@pytest.mark.parametrize("name", ["cpu_dense.yaml", "cpu_moe.yaml", "gpu_dense.yaml", "gpu_moe.yaml"])
def test_shipped_task_specs_load_and_their_baselines_are_legal(name):
    spec = load_task(TASKS / name)
    space = build_torch_space(spec)
    space.validate(space.defaults())
    assert TaskSpec.from_dict(spec.to_dict()) == spec


def test_unknown_key_names_the_dotted_path_and_the_file(tmp_path):
    path = copy_task(tmp_path, **{"workload.shape.hiden_size": 64})
    with pytest.raises(ConfigError) as e:
        load_task(path)
    assert "workload.shape.hiden_size" in str(e.value) and str(path) in str(e.value)


def test_wrong_type_names_the_field(tmp_path):
    path = copy_task(tmp_path, **{"timing.measured_steps": "five"})
    with pytest.raises(ConfigError, match=r"timing\.measured_steps: expected an integer"):
        load_task(path)


def test_missing_workspace_is_a_clear_error(tmp_path):
    path = copy_task(tmp_path, **{"workload.workspace": "nowhere"})
    with pytest.raises(ConfigError, match="not a directory"):
        load_task(path)


def test_illegal_baseline_is_refused_with_the_fix(tmp_path):
    path = copy_task(tmp_path, **{"search.baseline.micro_batch_size": 3})
    with pytest.raises((ConfigError, IllegalConfigError), match="micro_batch_size"):
        build_torch_space(load_task(path))


def test_micro_batch_that_does_not_divide_the_global_batch_is_illegal(tmp_path):
    spec = load_task(copy_task(tmp_path))
    space = build_torch_space(spec)
    gbs = spec.workload.global_batch_size
    bad = {**space.defaults(), "num_workers": 2, "micro_batch_size": gbs}
    with pytest.raises(IllegalConfigError, match="does not divide the locked global batch"):
        space.validate(bad)


def _locked(tmp_path: Path) -> tuple[Contract, Path]:
    spec = load_task(copy_task(tmp_path))
    contract = lock(spec, baseline_config=build_torch_space(spec).defaults(),
                    loss_trace=[7.0, 6.9, 6.8, 6.7, 6.6], model_stats={"num_params": 10})
    contract.save(tmp_path / "run")
    return Contract.load(tmp_path / "run"), spec.workspace_path()


def test_contract_round_trips_and_freezes_harness_and_entry(tmp_path):
    contract, _ = _locked(tmp_path)
    assert "workspace/entry.py" in contract.frozen_files
    assert any(k.startswith("harness/") for k in contract.frozen_files)
    contract.verify_frozen()
    assert contract.work.tokens_per_step == contract.spec().workload.tokens_per_step


def test_tampered_frozen_file_is_caught_and_named(tmp_path):
    contract, ws = _locked(tmp_path)
    (ws / "entry.py").write_text((ws / "entry.py").read_text() + "\n# sneaky\n")
    with pytest.raises(FrozenFileChangedError, match="workspace/entry.py"):
        contract.verify_frozen()


def test_edited_contract_json_is_refused(tmp_path):
    _locked(tmp_path)
    path = tmp_path / "run" / "contract.json"
    path.write_text(path.read_text().replace('"steps": 4', '"steps": 2'))
    with pytest.raises(FrozenFileChangedError, match="edited after"):
        Contract.load(tmp_path / "run")


def test_loss_and_work_checks(tmp_path):
    contract, _ = _locked(tmp_path)
    assert contract.check_loss([7.0, 6.9, 6.8, 6.7], "fp32") is None
    assert "drifted at step 2" in contract.check_loss([7.0, 6.9, 6.5, 6.7], "fp32")
    assert contract.check_loss([7.0, 6.9, 6.8, 6.72], "bf16") is None
    # every step the baseline ran is compared, not only the first K (4 here)
    assert contract.check_loss([7.0, 6.9, 6.8, 6.7, 6.6], "fp32") is None
    assert "drifted at step 4" in contract.check_loss([7.0, 6.9, 6.8, 6.7, 6.2], "fp32")
    assert "work per step changed" in contract.check_work(17)
    assert frozen_paths(contract.spec())


def test_missing_contract_says_run_init(tmp_path):
    with pytest.raises(ContractError, match="infrarsi init"):
        Contract.load(tmp_path)
