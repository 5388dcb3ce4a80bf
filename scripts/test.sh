#!/usr/bin/env bash
# Set up and run the test suite. When PostgreSQL's server binaries are installed (Debian package
# `postgresql`), a throwaway server on loopback backs the PostgreSQL half of the bank suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
run=(.venv/bin/python -m pytest -q -p no:cacheprovider)
# The multi-node fault suite (~9 min) is its own CI step: `bash scripts/test.sh -m "slow and faults"`.
if [[ " $* " != *" -m "* ]]; then run+=(-m "not (slow and faults)"); fi
run+=("$@")
if [ -z "${INFRARSI_TEST_POSTGRES_URL:-}" ] && [ -f scripts/with_postgres.sh ] \
   && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  exec bash scripts/with_postgres.sh "${run[@]}"
fi
exec "${run[@]}"
