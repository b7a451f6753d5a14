# Sourced by the service scripts (after log and die are defined): what a
# server's life needs whatever the server. The caller sets HOST and PORT
# (port_open), PIDFILE and defines is_ours PID (find_pid), STATE (lock)
# and STOP_TIMEOUT (stop_pid TERM).

# wait_tests_done SERVICE waits while a test holds SERVICE exclusively
# (testenv.KafkaExclusive, MySQLExclusive, RedisExclusive: it may have
# killed, paused or restarted the service on purpose and will bring it back
# itself). Without it, an `up` from another checkout's `make test` at that
# moment found the service down and started a fresh one — for Kafka on a new
# data dir, wiping the test's topics. The lock is the tests' own flock
# (internal/testenv); it is held shared on fd 8 until the script exits, so
# a service the script launches must not inherit fd 8 (`8>&-`): a server
# holding it would keep every exclusive test out for as long as it runs.
# Take it before the script's own lock, which the test's `start` needs.
wait_tests_done() {
  exec 8>"${TMPDIR:-/tmp}/idem-$1-tests.lock"
  if ! flock -s -n 8; then
    log "a test holds $1 exclusively; waiting for it to end"
    flock -s -w 900 8 || die "a test held $1 exclusively for 15 minutes"
  fi
}

# lock [DIR]: the script's own lock on DIR (default $STATE), on fd 9, held
# until it exits. A server the script launches must not inherit it (`9>&-`).
lock() {
  local dir=${1:-$STATE}
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
}

# apt_install PACKAGE...: install Debian's packages (as root only).
apt_install() {
  [ "$(id -u)" = 0 ] || die "$1 is not installed and this is not root"
  log "installing $1 from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# find_pid: print the server's pid, from the pid file or, if that is gone,
# by looking for a process is_ours recognises.
find_pid() {
  local pid=""
  [[ -f "$PIDFILE" ]] && pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  if is_ours "$pid"; then echo "$pid"; return 0; fi
  local p
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    if is_ours "$p"; then echo "$p"; return 0; fi
  done
  return 1
}

# port_open [PORT]: something accepts connections on HOST:PORT.
port_open() {
  (exec 3<>"/dev/tcp/$HOST/${1:-$PORT}") 2>/dev/null
}

# stop_pid PID TERM|KILL: TERM waits up to STOP_TIMEOUT seconds for the
# server to exit, then kills it; either way it returns once the process is
# gone (up to 10 s), so the ports are free for a restart.
stop_pid() {
  local pid=$1 mode=$2
  kill -0 "$pid" 2>/dev/null || return 0
  if [[ "$mode" == TERM ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + STOP_TIMEOUT))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "pid $pid still alive after ${STOP_TIMEOUT}s, sending SIGKILL"
    fi
  fi
  kill -KILL "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
}

# stop_server NAME: stop the server (stop_pid TERM) under the script's
# lock; NAME is what the log calls it.
stop_server() {
  lock
  local pid
  if pid="$(find_pid)"; then
    log "stopping $1 (pid $pid)"
    stop_pid "$pid" TERM
    log "stopped"
  else
    log "$1 not running"
  fi
}

# kill_server NAME: kill -9 the server (a crash) under the script's lock;
# NAME is what the log calls it.
kill_server() {
  lock
  local pid
  if pid="$(find_pid)"; then
    log "killing $1 (pid $pid) with SIGKILL"
    stop_pid "$pid" KILL
  else
    log "$1 not running"
  fi
}

# run_command ENV CMD: run the script's subcommand CMD, one of up, down,
# kill, start and status (the script's cmd_CMD), or env (print ENV).
run_command() {
  case "${2:-}" in
    up | down | kill | start | status) "cmd_$2" ;;
    env) echo "$1" ;;
    *)
      echo "usage: $0 up|down|env|kill|start|status" >&2
      exit 2
      ;;
  esac
}
