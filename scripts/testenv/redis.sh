#!/usr/bin/env bash
# Redis from Debian's packages for the Redis front's tests, run as its own
# server: state under the test dir, 127.0.0.1:6380, no persistence. The
# machine's system service (port 6379) is left alone.
#
# Usage: scripts/testenv/redis.sh up|down|env|kill|start|status
#   up     install redis-server when missing, start it unless it answers
#   down   stop the server (SHUTDOWN NOSAVE, then SIGKILL)
#   env    print the environment for the tests (eval "$(redis.sh env)")
#   kill   kill -9 the server (a crash: everything it held is gone)
#   start  start the server again (empty)
#   status exit 0 if the server is running and answering
#
# Environment:
#   IDEM_TESTENV_DIR   runtime state (default /tmp/idem-testenv)
#   IDEM_REDIS_PORT    port (default 6380)
#
# Progress goes to stderr; only `env` writes to stdout.
set -euo pipefail

HOST=127.0.0.1
PORT="${IDEM_REDIS_PORT:-6380}"
STATE="${IDEM_TESTENV_DIR:-/tmp/idem-testenv}/redis"
CONF="$STATE/redis.conf"
PIDFILE="$STATE/redis.pid"
LOGFILE="$STATE/redis.log"
READY_TIMEOUT=30

log() { printf 'redis.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=service_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/service_lib.sh"

install() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null && return 0
  apt_install redis-server redis-tools
  command -v redis-server >/dev/null || die "redis-server not found after installing it"
}

write_config() {
  mkdir -p "$STATE"
  cat >"$CONF.tmp" <<CONF
# written by scripts/testenv/redis.sh
bind $HOST
port $PORT
protected-mode no
daemonize no
dir $STATE
pidfile $PIDFILE
logfile $LOGFILE
save ""
appendonly no
maxmemory 256mb
maxmemory-policy volatile-lru
CONF
  mv "$CONF.tmp" "$CONF"
}

is_ours() {
  local pid=$1 comm
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  read -r comm <"/proc/$pid/comm" 2>/dev/null || return 1
  [[ "$comm" == redis-server* ]] || return 1
  # redis-server rewrites its title to "redis-server 127.0.0.1:PORT".
  [[ "$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" == *"$HOST:$PORT"* ]]
}

answers() { [[ "$(redis-cli -h "$HOST" -p "$PORT" ping 2>/dev/null)" == PONG ]]; }

launch() {
  port_open && die "$HOST:$PORT is already in use by another process (not the server under $STATE)"
  local pid deadline=$((SECONDS + READY_TIMEOUT))
  log "starting redis-server on $HOST:$PORT (log: $LOGFILE)"
  setsid nohup redis-server "$CONF" >/dev/null 2>&1 </dev/null 8>&- 9>&- &
  pid=$!
  disown "$pid" 2>/dev/null || true
  while ((SECONDS < deadline)); do
    # setsid forks when its caller leads a process group: find the server.
    kill -0 "$pid" 2>/dev/null || pid="$(find_pid)" || true
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 20 "$LOGFILE" >&2 || true
      die "redis-server exited during startup"
    fi
    if answers; then
      log "redis-server ready on $HOST:$PORT (pid $pid)"
      return 0
    fi
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  die "redis-server not ready after ${READY_TIMEOUT}s"
}

cmd_up() {
  install
  wait_tests_done redis
  lock
  local pid
  if pid="$(find_pid)" && answers; then
    log "redis-server already running on $HOST:$PORT (pid $pid)"
    return 0
  fi
  [[ -n "${pid:-}" ]] && stop_pid "$pid" KILL
  write_config
  launch
}

cmd_start() {
  lock
  if find_pid >/dev/null && answers; then
    log "redis-server already running on $HOST:$PORT"
    return 0
  fi
  write_config
  launch
}

cmd_down() {
  lock
  local pid
  if pid="$(find_pid)"; then
    log "stopping redis-server (pid $pid)"
    redis-cli -h "$HOST" -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
    stop_pid "$pid" KILL
  else
    log "redis-server not running"
  fi
}

cmd_kill() { kill_server redis-server; }

cmd_status() {
  if find_pid >/dev/null && answers; then
    log "redis-server running on $HOST:$PORT"
    return 0
  fi
  log "redis-server not running"
  return 1
}

run_command "export IDEM_TEST_REDIS_ADDR=$HOST:$PORT" "$@"
