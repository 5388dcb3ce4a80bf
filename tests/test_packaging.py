"""Package data and the home folder: what a wheel user gets.

* every catalog entry (and the seed bundle, the task and table specs) is read from the installed
  package through importlib.resources, and a missing catalog file is an error, never skipped;
* the default bank, run folders and the LATEST pointer live under $INFRARSI_HOME, whatever the
  current folder;
* the measured tables come from $INFRARSI_DATA_DIR or an explicit path, and the error names
  the variable when neither is given;
* (slow) the built wheel holds every data file of the package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

import pytest

import infrarsi
from infrarsi import _home
from infrarsi.errors import ConfigError, PackageDataError

ROOT = Path(__file__).resolve().parents[1]


def _catalog_yaml() -> list[str]:
    cat = resources.files("infrarsi") / "patches" / "catalog"
    return sorted(f"{k}/{p.name}" for k in ("honest", "gaming") for p in (cat / k).iterdir()
                  if p.name.endswith(".yaml"))


def test_every_catalog_entry_loads_from_the_package():
    from infrarsi.patches import load_catalog

    listed = _catalog_yaml()
    entries = load_catalog()
    assert len(listed) >= 28 and len(entries) == len(listed)
    assert sorted(f"{e.kind}/{e.patch.id}.yaml" for e in entries) == listed
    cat = resources.files("infrarsi") / "patches" / "catalog"
    for e in entries:
        assert e.patch.diff == (cat / e.kind / f"{e.patch.id}.diff").read_text()


def test_a_missing_catalog_diff_is_an_error(tmp_path, monkeypatch):
    import shutil

    from infrarsi.patches import _catalog

    src = Path(str(resources.files("infrarsi") / "patches" / "catalog"))
    shutil.copytree(src, tmp_path / "catalog")
    (tmp_path / "catalog" / "honest" / "sdpa_attention.diff").unlink()
    monkeypatch.setattr(_catalog, "package_path",
                        lambda pkg, *parts, kind="any": tmp_path.joinpath(*parts[1:]))
    with pytest.raises(PackageDataError, match=r"honest/sdpa_attention.*sdpa_attention\.diff"):
        _catalog.load_catalog()


def test_the_run_stage_does_not_swallow_a_broken_package():
    from infrarsi.search._patch_stage import _propose

    class Broken:
        name = "expert"

        def patches(self, context):
            raise PackageDataError("infrarsi/patches/catalog/honest/x.diff: missing")

    lines: list[str] = []
    with pytest.raises(PackageDataError):
        _propose(Broken(), {}, lines.append)


def test_shipped_seed_and_specs_are_package_data():
    from infrarsi._resources import package_path, task_specs
    from infrarsi.bank._seed import seed_dir
    from infrarsi.bench._sources import DEFAULT_TABLE_SPEC
    from infrarsi.contract import load_task

    pkg = Path(infrarsi.__file__).resolve().parent
    assert seed_dir().resolve() == pkg / "bank" / "seed"
    assert (seed_dir() / "manifest.json").is_file()
    assert pkg in DEFAULT_TABLE_SPEC.resolve().parents
    assert set(task_specs()) >= {"cpu_dense", "cpu_moe", "gpu_dense", "gpu_moe"}
    spec = load_task("cpu_dense")
    assert spec.name == "cpu_dense" and spec.workspace_path() == pkg / "workloads" / "reference"
    with pytest.raises(ConfigError, match="built-in tasks: cpu_dense"):
        load_task("no_such_task")
    with pytest.raises(PackageDataError, match="reinstall"):
        package_path("infrarsi", "no", "such.file", kind="file")


def test_home_folder_holds_bank_runs_and_latest(tmp_path, monkeypatch):
    from infrarsi.bank._engine import default_url
    from infrarsi.contract import load_task, resolve_run_dir
    from infrarsi.contract.contract import CONTRACT_FILE
    from infrarsi.rundir import point_latest

    home = tmp_path / "home"
    monkeypatch.setenv("INFRARSI_HOME", str(home))
    monkeypatch.delenv("INFRARSI_BANK_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_url() == f"sqlite:///{home / 'bank.sqlite'}"
    assert load_task("cpu_dense").run_path() == home / "runs" / "cpu_dense"
    run = tmp_path / "elsewhere" / "r1"
    run.mkdir(parents=True)
    (run / CONTRACT_FILE).write_text("{}")
    point_latest(run)
    assert (home / "runs" / "LATEST").read_text().strip() == str(run.resolve())
    other = tmp_path / "another_cwd"
    other.mkdir()
    monkeypatch.chdir(other)
    assert resolve_run_dir(None) == run.resolve()


def test_home_defaults_to_the_user_data_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("INFRARSI_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    if sys.platform != "win32":
        assert _home.home() == tmp_path / "xdg" / "infrarsi"
        monkeypatch.delenv("XDG_DATA_HOME")
        assert _home.home() == Path.home() / ".local" / "share" / "infrarsi"


def test_data_dir_is_an_env_var_or_an_explicit_path(tmp_path, monkeypatch):
    from infrarsi.backends.table import load_table_spec, resolve_csv_path
    from infrarsi.bench._sources import DEFAULT_TABLE_SPEC

    spec = load_table_spec(DEFAULT_TABLE_SPEC)
    monkeypatch.delenv("INFRARSI_DATA_DIR", raising=False)
    with pytest.raises(ConfigError, match="INFRARSI_DATA_DIR"):
        resolve_csv_path(spec)
    assert resolve_csv_path(spec, tmp_path / "x.csv") == tmp_path / "x.csv"
    monkeypatch.setenv("INFRARSI_DATA_DIR", str(tmp_path))
    assert resolve_csv_path(spec) == (tmp_path / spec.csv).resolve()


def test_no_product_file_names_a_development_machine():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    bad = ("../shared", "/work/", "/root/")
    hits = []
    for rel in tracked.stdout.split():
        p = ROOT / rel
        # .ci/run is this repository's CI job, not the product: it names the measured tables
        # for the CI machine explicitly through INFRARSI_DATA_DIR, as a user would
        if rel in ("tests/test_packaging.py", ".ci/run") or p.is_symlink() or not p.is_file():
            continue
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{rel}: {b}" for b in bad if b in text]
    assert not hits, hits


@pytest.mark.slow
def test_the_wheel_holds_every_data_file(tmp_path):
    """`pip wheel --no-deps` of the checkout carries every non-.py file of the package."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("infrarsi-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    pkg = ROOT / "infrarsi"
    data = [p.relative_to(ROOT).as_posix() for p in pkg.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert any(d.endswith(".diff") for d in data) and any(d.endswith(".parquet") for d in data)
    assert sorted(d for d in data if d not in names) == []
    assert "infrarsi/bank/seed/manifest.json" in names
