#!/usr/bin/env bash
# MariaDB from Debian's packages for the MySQL store's tests, run as its own
# server: data under the test dir, 127.0.0.1:3307, a socket of its own. The
# machine's system service (port 3306, /run/mysqld) is left alone.
#
# Usage: scripts/testenv/mariadb.sh up|down|env|kill|start|status
#   up     install mariadb-server when missing, create the data dir when
#          missing, start the server unless it answers, create the test
#          database and a password-less root@127.0.0.1
#   down   stop the server (shutdown, up to 60 s, then SIGKILL)
#   env    print the environment for the tests (eval "$(mariadb.sh env)")
#   kill   kill -9 the server (a crash); the data dir is kept
#   start  start the server again on the existing data dir (crash recovery)
#   status exit 0 if the server is running and answering
#
# Settings: innodb_flush_log_at_trx_commit=2 writes the redo log to the OS
# at every COMMIT and syncs it once a second: a commit survives a crash of
# the server (kill -9), not of the machine. Fast, and never for benchmarks
# of durability. No binary log.
#
# Environment:
#   IDEM_TESTENV_DIR    runtime state (default /tmp/idem-testenv)
#   IDEM_MARIADB_PORT   port (default 3307)
#
# Progress goes to stderr; only `env` writes to stdout.
set -euo pipefail

HOST=127.0.0.1
PORT="${IDEM_MARIADB_PORT:-3307}"
DB=idem_test
STATE="${IDEM_TESTENV_DIR:-/tmp/idem-testenv}/mariadb"
DATA="$STATE/data"
CNF="$STATE/my.cnf"
SOCK="$STATE/mariadbd.sock"
PIDFILE="$STATE/mariadbd.pid"
ERRLOG="$STATE/mariadbd.err"
READY_TIMEOUT=120
STOP_TIMEOUT=60

log() { printf 'mariadb.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=service_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/service_lib.sh"

dsn() { echo "root@tcp($HOST:$PORT)/$DB"; }

install() {
  if command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null && command -v mariadb-admin >/dev/null; then
    return 0
  fi
  apt_install mariadb-server mariadb-client
  command -v mariadbd >/dev/null || die "mariadbd not found after installing mariadb-server"
}

write_config() {
  mkdir -p "$STATE"
  cat >"$CNF.tmp" <<CONF
# written by scripts/testenv/mariadb.sh
[mysqld]
datadir = $DATA
socket = $SOCK
pid-file = $PIDFILE
log-error = $ERRLOG
port = $PORT
bind-address = $HOST
user = root
skip-name-resolve
skip-log-bin
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
max_connections = 500
innodb_buffer_pool_size = 256M
innodb_log_file_size = 128M
# A commit reaches the OS at COMMIT: it survives kill -9 of the server.
innodb_flush_log_at_trx_commit = 2
# Claims and handlers set their own (the store's LockTimeout).
innodb_lock_wait_timeout = 50
CONF
  mv "$CNF.tmp" "$CNF"
}

# is_ours PID: PID is a mariadbd started with our config file.
is_ours() {
  local pid=$1 cmd
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$cmd" == *"--defaults-file=$CNF"* ]]
}

answers() { mariadb-admin --no-defaults --socket="$SOCK" -uroot --connect-timeout=2 ping >/dev/null 2>&1; }

wait_ready() {
  local pid=$1 deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    # setsid forks when its caller leads a process group: find the server.
    kill -0 "$pid" 2>/dev/null || pid="$(find_pid)" || pid=$1
    if ! kill -0 "$pid" 2>/dev/null; then
      log "mariadbd (pid $pid) exited during startup; last 30 lines of $ERRLOG:"
      tail -n 30 "$ERRLOG" >&2 || true
      return 1
    fi
    if answers && port_open; then
      return 0
    fi
    sleep 0.2
  done
  log "mariadbd (pid $pid) not ready after ${READY_TIMEOUT}s; last 30 lines of $ERRLOG:"
  tail -n 30 "$ERRLOG" >&2 || true
  return 1
}

init_data() {
  log "creating the data dir $DATA"
  rm -rf "$DATA"
  mkdir -p "$DATA"
  mariadb-install-db --defaults-file="$CNF" --auth-root-authentication-method=normal \
    --skip-test-db >"$STATE/install-db.log" 2>&1 \
    || { tail -n 30 "$STATE/install-db.log" >&2; die "mariadb-install-db failed"; }
}

launch() {
  port_open && die "$HOST:$PORT is already in use by another process (not the server under $STATE)"
  local pid start=$SECONDS
  log "starting mariadbd on $HOST:$PORT (log: $ERRLOG)"
  rm -f "$SOCK"
  # setsid+nohup: survive the calling shell; fd 9 (our lock) must not leak.
  setsid nohup mariadbd --defaults-file="$CNF" >/dev/null 2>&1 </dev/null 8>&- 9>&- &
  pid=$!
  disown "$pid" 2>/dev/null || true
  if ! wait_ready "$pid"; then
    stop_pid "$pid" KILL
    die "mariadbd did not start"
  fi
  log "mariadbd ready on $HOST:$PORT (pid $pid) after $((SECONDS - start)) s"
}

bootstrap() {
  mariadb --no-defaults --socket="$SOCK" -uroot <<SQL
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
CREATE DATABASE IF NOT EXISTS \`$DB\` CHARACTER SET utf8mb4;
SQL
}

cmd_up() {
  install
  wait_tests_done mariadb
  lock
  local pid
  if pid="$(find_pid)"; then
    if wait_ready "$pid"; then
      bootstrap
      log "mariadbd already running on $HOST:$PORT (pid $pid)"
      return 0
    fi
    log "mariadbd (pid $pid) does not answer; restarting it"
    stop_pid "$pid" KILL
  fi
  write_config
  [[ -d "$DATA/mysql" ]] || init_data
  launch
  bootstrap
  log "ready: $(dsn)"
}

cmd_start() {
  lock
  local pid
  if pid="$(find_pid)"; then
    wait_ready "$pid" || die "mariadbd (pid $pid) does not answer"
    log "mariadbd already running on $HOST:$PORT (pid $pid)"
    return 0
  fi
  [[ -d "$DATA/mysql" ]] || die "no data dir at $DATA: run up first"
  write_config
  launch
}

cmd_down() { stop_server mariadbd; }

cmd_kill() { kill_server mariadbd; }

cmd_status() {
  local pid
  if pid="$(find_pid)" && answers; then
    log "mariadbd running on $HOST:$PORT (pid $pid)"
    return 0
  fi
  log "mariadbd not running"
  return 1
}

run_command "export IDEM_TEST_MYSQL_DSN='$(dsn)'" "$@"
