"""The shipped seed experience imports once, keeps its origin, and is found by the table
backend's workload signatures."""

from __future__ import annotations

from infrarsi.bank import ExperienceBank
from infrarsi.bank._seed import ensure_seed, seed_dir
from infrarsi.trial import HardwareFingerprint, WorkloadSignature

W8B = WorkloadSignature("dense", 8030261248, 32, 4096, 32, 4096, 256, vocab_size=128256)
H100x4 = HardwareFingerprint("H100-80GB", 80_000_000_000, 8, 4, "nvlink+infiniband", 9.89e14)


def test_seed_imports_once_with_origin(tmp_path):
    assert (seed_dir() / "manifest.json").is_file()  # shipped in the package, never optional
    bank = ExperienceBank.open(f"sqlite:///{tmp_path / 'b.sqlite'}")
    assert ensure_seed(bank) is True
    assert ensure_seed(bank) is False
    st = bank.stats()
    assert st["trials_by_origin"] == {"seed:ultrascale-playbook": st["tables"]["trials"]}
    best = bank.nearest(W8B, H100x4, k=3)
    assert best[0].distance == 0 and best[0].record.ok
    assert best[0].record.tokens_per_s >= best[1].record.tokens_per_s
    assert bank.findings("micro_batch_size", workload=W8B)
    bank.close()
