#!/usr/bin/env bash
# Postgres 15 from Debian's packages, as root, trust auth on 127.0.0.1.
#
#   postgres.sh up      install when missing, start the cluster, create the test database
#   postgres.sh down    stop the cluster
#   postgres.sh env     print IDEM_TEST_PG_URL
#
# The test cluster runs with fsync off: fast, and never for benchmarks.
# With IDEM_PG_DURABLE=1 (scripts/testenv/postgres-durable.sh) it manages a second
# cluster for benchmarks instead: port 5433, fsync and synchronous_commit on.
# IDEM_PG_SHARED_BUFFERS (durable cluster only; e.g. 6GB) sets its
# shared_buffers; unset, Postgres's default (128MB). `up` restarts the
# cluster when the setting changes: check that no benchmark is using it.
# Do not name a variable PGCLUSTER: Debian's pg_wrapper reads it.
set -euo pipefail
PG_VER=${IDEM_PG_VERSION:-15}
if [ "${IDEM_PG_DURABLE:-0}" = 1 ]; then
  PG_NAME=${IDEM_PG_CLUSTER:-idem_bench}
  PG_PORT=${IDEM_PG_PORT:-5433}
  PG_DB=${IDEM_PG_DB:-idem_bench}
  ENV_VAR=IDEM_BENCH_PG_URL
  SETTINGS="# durable: what production runs
fsync = on
synchronous_commit = on
full_page_writes = on"
  if [ -n "${IDEM_PG_SHARED_BUFFERS:-}" ]; then
    [[ "$IDEM_PG_SHARED_BUFFERS" =~ ^[0-9]+(kB|MB|GB)$ ]] || { echo "IDEM_PG_SHARED_BUFFERS=$IDEM_PG_SHARED_BUFFERS: want a size such as 6GB" >&2; exit 2; }
    SETTINGS="$SETTINGS
shared_buffers = $IDEM_PG_SHARED_BUFFERS"
  fi
else
  PG_NAME=${IDEM_PG_CLUSTER:-main}
  PG_PORT=${IDEM_PG_PORT:-5432}
  PG_DB=${IDEM_PG_DB:-idem_test}
  ENV_VAR=IDEM_TEST_PG_URL
  SETTINGS="# a fast, throwaway test cluster
fsync = off
synchronous_commit = off
full_page_writes = off"
fi
log() { echo "postgres($PG_NAME): $*" >&2; }

url() { echo "postgres://postgres@127.0.0.1:$PG_PORT/$PG_DB?sslmode=disable"; }

status() { pg_lsclusters -h 2>/dev/null | awk -v v="$PG_VER" -v c="$PG_NAME" '$1==v && $2==c {print $4}'; }

up() {
  if [ ! -x "/usr/lib/postgresql/$PG_VER/bin/postgres" ] || ! command -v pg_createcluster >/dev/null; then
    [ "$(id -u)" = 0 ] || { log "postgresql-$PG_VER is not installed and this is not root"; exit 1; }
    log "installing postgresql-$PG_VER from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "postgresql-$PG_VER" "postgresql-client-$PG_VER" >/dev/null
  fi
  if [ -z "$(status)" ]; then
    log "creating cluster $PG_VER/$PG_NAME on port $PG_PORT"
    pg_createcluster "$PG_VER" "$PG_NAME" --port="$PG_PORT" >/dev/null
  fi
  local conf="/etc/postgresql/$PG_VER/$PG_NAME"
  local want
  want=$(cat <<CONF
# written by scripts/testenv/postgres.sh
listen_addresses = '127.0.0.1'
port = $PG_PORT
$SETTINGS
max_connections = 300
# Batches that update shared rows from several lanes can deadlock; detect it fast.
deadlock_timeout = 100ms
CONF
)
  local changed=0
  if [ "$(cat "$conf/conf.d/99-idem-tests.conf" 2>/dev/null)" != "$want" ]; then
    echo "$want" >"$conf/conf.d/99-idem-tests.conf"
    changed=1
  fi
  if grep -Eq '^host[[:space:]]+all[[:space:]]+all[[:space:]]+(127\.0\.0\.1/32|::1/128)[[:space:]]+(scram-sha-256|md5|peer|ident)' "$conf/pg_hba.conf"; then
    sed -i -E 's/^(host[[:space:]]+all[[:space:]]+all[[:space:]]+(127\.0\.0\.1\/32|::1\/128)[[:space:]]+)[a-z0-9-]+/\1trust/' "$conf/pg_hba.conf"
    changed=1
  fi
  if [ "$(status)" = online ]; then
    if [ "$changed" = 1 ]; then
      log "restarting with the test settings"
      pg_ctlcluster "$PG_VER" "$PG_NAME" restart
    fi
  else
    log "starting cluster $PG_VER/$PG_NAME"
    pg_ctlcluster "$PG_VER" "$PG_NAME" start
  fi
  for _ in $(seq 1 100); do
    pg_isready -q -h 127.0.0.1 -p "$PG_PORT" && break
    sleep 0.1
  done
  pg_isready -q -h 127.0.0.1 -p "$PG_PORT" || { log "not ready on 127.0.0.1:$PG_PORT"; exit 1; }
  if ! psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -Atc "SELECT 1 FROM pg_database WHERE datname='$PG_DB'" | grep -q 1; then
    psql -h 127.0.0.1 -p "$PG_PORT" -U postgres -qc "CREATE DATABASE \"$PG_DB\"" >/dev/null
  fi
  log "ready: $(url)"
}

case "${1:-}" in
  up) up ;;
  down) [ -n "$(status)" ] && pg_ctlcluster "$PG_VER" "$PG_NAME" stop || true ;;
  env) echo "export $ENV_VAR='$(url)'" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
