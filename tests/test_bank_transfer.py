"""Transfer across hardware: ranks carry over, times rescale, memory relative to capacity."""

from __future__ import annotations

import pytest
from bank_conformance import A100, GPT, H100, SOFTWARE, ok_trial, oom_trial

from infrarsi.bank import ExperienceBank
from infrarsi.bank.transfer import time_scale, transfer, transfer_records
from infrarsi.trial import HardwareFingerprint

SMALL = HardwareFingerprint("A100-40GB", 40 << 30, 8, 1, "nvlink", 312e12)


def test_time_scale_from_specs_and_refined_by_shared_configs():
    s = time_scale(A100, H100)
    assert 0.25 < s < 0.5  # H100 is faster: times shrink by ~ (312/989)^0.7 (2.0/3.35)^0.3
    assert time_scale(A100, H100, [(1.0, 0.5), (2.0, 1.0)]) == pytest.approx(
        0.5 ** (2 / 3) * s ** (1 / 3))
    assert time_scale(A100, A100) == pytest.approx(1.0)


def test_ranks_carry_over_and_memory_relative_to_target_capacity():
    src = [ok_trial("a", 1, 1.0, hardware=A100, peak=30 << 30),
           ok_trial("b", 2, 0.5, hardware=A100, peak=50 << 30),
           oom_trial("c", 8, hardware=A100)]
    seeds = transfer_records([(A100, src)], SMALL)
    assert [s.config["micro_batch_size"] for s in seeds] == [1, 2, 8]
    fast, slow, oom = seeds[1], seeds[0], seeds[2]
    # b needs 50 GiB: predicted OOM on the 40 GiB device, so a becomes the best
    assert slow.predicted_relative_speed == 1.0 and slow.predicted_memory_fraction == 0.75
    assert fast.predicted_memory_fraction == 1.25 and fast.predicted_relative_speed == 0.0
    assert oom.memory_is_lower_bound and oom.predicted_memory_fraction == 2.0
    roomy = transfer_records([(A100, src)], H100)
    assert roomy[0].config["micro_batch_size"] == 2 and roomy[1].predicted_relative_speed == 0.5
    assert roomy[0].predicted_step_time_s == pytest.approx(0.5 * time_scale(A100, H100))
    assert "A100-80GB" in roomy[0].source


def test_transfer_from_bank(tmp_path):
    bank = ExperienceBank.open(f"sqlite:///{tmp_path / 'b.sqlite'}")
    ra = bank.start_run("gpt2", "c", GPT, A100, SOFTWARE, {})
    bank.record_trials(ra, [ok_trial("1", 1, 1.0, hardware=A100), ok_trial("2", 2, 0.8, hardware=A100),
                            ok_trial("4", 4, 0.6, hardware=A100)])
    rh = bank.start_run("gpt2", "c", GPT, H100, SOFTWARE, {})
    bank.record_trials(rh, [ok_trial("1", 1, 0.25, hardware=H100)])  # measured on both: 4x
    seeds = transfer(bank, GPT, H100)
    assert [s.config["micro_batch_size"] for s in seeds] == [4, 2]  # mbs 1 already measured
    assert seeds[0].predicted_step_time_s == pytest.approx(
        0.6 * time_scale(A100, H100, [(1.0, 0.25)]))
    assert seeds[1].predicted_relative_speed == pytest.approx(0.6 / 0.8)
    bank.close()
