#!/usr/bin/env bash
# Run a command against a throw-away PostgreSQL server.
#
#   scripts/with_postgres.sh .venv/bin/pytest tests/test_bank_conformance.py
#
# Installs nothing. Needs the server binaries of the Debian/Ubuntu package `postgresql`
# (`apt-get install -y postgresql`; they land in /usr/lib/postgresql/<major>/bin) or PGBIN
# pointing at a directory holding initdb, pg_ctl and createdb.
#
# What it does: initdb in a fresh temp dir, starts the server with pg_ctl on 127.0.0.1 at a
# free port (unix socket inside the temp dir, trust auth on loopback only), creates database
# `infrarsi_test`, exports
#   INFRARSI_TEST_POSTGRES_URL   postgresql+psycopg://infrarsi@127.0.0.1:<port>/infrarsi_test
#   INFRARSI_TEST_POSTGRES_DATA  the data directory (for fault tests that restart the server)
#   INFRARSI_TEST_POSTGRES_CTL   a pg_ctl command line for that data directory
# runs the command, then stops that server (pg_ctl stop on its own data dir) and removes the
# temp dir. As root, the server runs as the unprivileged user `postgres` (created by the
# package) because initdb refuses to run as root. Exit status is the command's.
set -euo pipefail

if [ "$#" -eq 0 ]; then
  echo "usage: scripts/with_postgres.sh COMMAND [ARGS...]" >&2
  exit 2
fi

PGBIN="${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)}"
if [ -z "$PGBIN" ] || [ ! -x "$PGBIN/initdb" ] || [ ! -x "$PGBIN/pg_ctl" ]; then
  echo "with_postgres.sh: PostgreSQL server binaries not found." >&2
  echo "  Install them with: apt-get install -y postgresql   (or set PGBIN=/path/to/bin)" >&2
  exit 2
fi

RUNAS=()
if [ "$(id -u)" = "0" ]; then
  if ! id postgres >/dev/null 2>&1; then
    echo "with_postgres.sh: running as root but user 'postgres' does not exist (it comes with" >&2
    echo "  the postgresql package); initdb refuses to run as root." >&2
    exit 2
  fi
  RUNAS=(runuser -u postgres --)
fi

TMP="$(mktemp -d /tmp/infrarsi-pg.XXXXXX)"
chmod 755 "$TMP"
if [ "${#RUNAS[@]}" -gt 0 ]; then chown postgres: "$TMP"; fi
DATA="$TMP/data"
PY="$(command -v python3 || command -v python)"
PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

PG_CTL=("${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$DATA")
started=0
cleanup() {
  if [ "$started" = "1" ]; then
    "${PG_CTL[@]}" -m fast -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"${RUNAS[@]}" "$PGBIN/initdb" -D "$DATA" -U infrarsi --auth=trust -E UTF8 --no-locale \
  >"$TMP/initdb.log" 2>&1 || { cat "$TMP/initdb.log" >&2; exit 1; }
started=1
"${PG_CTL[@]}" -l "$TMP/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $PORT -k $TMP -c max_connections=200 -c fsync=off" \
  start >/dev/null || { cat "$TMP/server.log" >&2; exit 1; }
"$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U infrarsi infrarsi_test

export INFRARSI_TEST_POSTGRES_URL="postgresql+psycopg://infrarsi@127.0.0.1:$PORT/infrarsi_test"
export INFRARSI_TEST_POSTGRES_DATA="$DATA"
export INFRARSI_TEST_POSTGRES_CTL="${PG_CTL[*]}"
echo "with_postgres.sh: PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT" >&2

set +e
"$@"
rc=$?
set -e
exit "$rc"
