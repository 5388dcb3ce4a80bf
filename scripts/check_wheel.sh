#!/usr/bin/env bash
# CI packaging step: build the wheel, install it into a fresh venv in a temporary folder outside
# the checkout, and from there use it as a user of the wheel would: `infrarsi --help`, load every
# patch catalog entry, open the default bank (seed imported) under a temporary INFRARSI_HOME, and
# run one `infrarsi trial cpu_dense` (the built-in task spec shipped in the package).
#
# The fresh venv gets only the wheel (--no-deps); the heavy dependencies (torch, ray, ...) come
# from the checkout's .venv through a .pth line. Such a line only appends the folder to sys.path
# (its own .pth files, e.g. the editable install of this checkout, are not processed), so
# `import infrarsi` finds the wheel's copy; the script checks that it does.
# Usage: bash scripts/check_wheel.sh        (needs .venv: bash scripts/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
[ -x .venv/bin/python ] || bash scripts/setup.sh
TMP=$(mktemp -d "${TMPDIR:-/tmp}/infrarsi-wheel-XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
unset PYTHONPATH INFRARSI_BANK_URL INFRARSI_DATA_DIR
export INFRARSI_HOME=$TMP/home

echo "== build the wheel"
.venv/bin/python -m pip wheel -q --no-deps -w "$TMP/dist" . 2>&1 | grep -v "^WARNING: Location" || true
WHEEL=$(ls "$TMP"/dist/infrarsi-*.whl)
echo "$WHEEL"

echo "== every data file under infrarsi/ is in the wheel"
git ls-files infrarsi | grep -v '\.py$' > "$TMP/data_files.txt"
.venv/bin/python - "$WHEEL" "$TMP/data_files.txt" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
wanted = [l.strip() for l in open(sys.argv[2]) if l.strip()]
missing = [w for w in wanted if w not in names]
assert wanted, "no data files listed"
assert not missing, f"{len(missing)} data file(s) not in the wheel: {missing}"
print(f"{len(wanted)} data files present ({sum(w.endswith('.diff') for w in wanted)} catalog diffs)")
PY

echo "== fresh venv outside the checkout"
.venv/bin/python -m venv "$TMP/venv"
"$TMP/venv/bin/python" -m pip install -q --no-deps --no-index "$WHEEL"
DEPS=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
SITE=$("$TMP/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$DEPS" > "$SITE/zz_infrarsi_ci_deps.pth"

mkdir -p "$TMP/cwd"
cd "$TMP/cwd"
echo "== infrarsi --help"
"$TMP/venv/bin/infrarsi" --help > /dev/null
echo "== catalog, default bank, task specs from the installed package"
"$TMP/venv/bin/python" - "$TMP" <<'PY'
import sys
from importlib import resources
from pathlib import Path

import infrarsi
from infrarsi import _home
from infrarsi.bank import ExperienceBank
from infrarsi.contract import load_task
from infrarsi.patches import load_catalog

tmp = Path(sys.argv[1]).resolve()
pkg = Path(infrarsi.__file__).resolve()
assert tmp / "venv" in pkg.parents, f"imported {pkg}, not the wheel's copy"
catalog_dir = resources.files("infrarsi") / "patches" / "catalog"
entries = load_catalog()
on_disk = sorted(p.stem for k in ("honest", "gaming") for p in (catalog_dir / k).glob("*.yaml"))
assert sorted(e.patch.id for e in entries) == on_disk and entries, (len(entries), len(on_disk))
assert all(e.patch.diff.strip() for e in entries)
print(f"catalog: {len(entries)} entries loaded from {catalog_dir}")
bank = ExperienceBank.open()
stats = bank.stats()
bank.close()
assert _home.default_bank_path().is_file() and tmp / "home" in _home.default_bank_path().parents
assert stats["trials_by_origin"].get("seed:ultrascale-playbook", 0) > 0, stats["trials_by_origin"]
print(f"default bank {_home.default_bank_path()}: seed trials "
      f"{stats['trials_by_origin']['seed:ultrascale-playbook']}")
spec = load_task("cpu_dense")
assert spec.workspace_path().is_dir() and tmp / "venv" in spec.workspace_path().parents
print(f"task cpu_dense: workspace {spec.workspace_path()}, run folder {spec.run_path()}")
PY
echo "== infrarsi trial cpu_dense"
"$TMP/venv/bin/infrarsi" trial cpu_dense
echo "packaging check passed"
