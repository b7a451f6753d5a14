#!/usr/bin/env bash
# Single-node Apache Kafka (KRaft, broker+controller) for integration tests,
# run from Maven Central jars without Docker. Needs Java 17 ($JAVA_HOME or
# java on PATH) and Maven (only for the first download).
#
# Usage: scripts/testenv/kafka.sh up|down|env|kill|start|status
#   up     start a fresh broker on 127.0.0.1:9092 (new data dir) unless one
#          from an earlier `up` is already running and answering
#   down   stop the broker (SIGTERM, up to 30 s, then SIGKILL)
#   env    print the environment for the tests (eval "$(kafka.sh env)")
#   kill   kill -9 the broker (simulated crash); data dir is kept
#   start  start the broker again on the existing data dir (no reformat)
#   status exit 0 if the broker is running and answering
#
# Environment:
#   IDEM_CACHE_DIR     jar cache root   (default $HOME/.cache/idem)
#   IDEM_TESTENV_DIR   runtime state    (default /tmp/idem-testenv)
#   IDEM_KAFKA_VERSION Kafka version    (default 4.1.1)
#
# Progress messages go to stderr; only `env` writes to stdout.
set -euo pipefail

KAFKA_VERSION="${IDEM_KAFKA_VERSION:-4.1.1}"
HOST=127.0.0.1
PORT=9092
CONTROLLER_PORT=9093 # must match testdata/brokers/kafka/server.properties
BROKERS="$HOST:$PORT"
READY_LINE='Kafka Server started'
READY_TIMEOUT=120
STOP_TIMEOUT=30
# Any base64url-encoded 16-byte UUID works; the data dir is fresh on `up`.
CLUSTER_ID=ax46DD9NSo6beiwdDl96kA

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="$ROOT/testdata/brokers/kafka"
CACHE="${IDEM_CACHE_DIR:-$HOME/.cache/idem}/kafka-$KAFKA_VERSION"
LIBS="$CACHE/libs"
STAMP="$CACHE/libs.stamp"
STATE="${IDEM_TESTENV_DIR:-/tmp/idem-testenv}/kafka"
DATA="$STATE/data"
LOGS="$STATE/logs"
CONF="$STATE/server.properties"
LOG4J="$STATE/log4j2.properties"
OUT="$STATE/kafka.out"
PIDFILE="$STATE/kafka.pid"

JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
JVM_OPTS=(
  -Xms256m -Xmx512m
  -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
  -XX:+ExplicitGCInvokesConcurrent
  -XX:TieredStopAtLevel=1
  -Djava.awt.headless=true
)

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=tests_lock.sh
. "$(dirname "${BASH_SOURCE[0]}")/tests_lock.sh"

# --- jars -----------------------------------------------------------------

stamp_value() {
  printf '%s %s\n' "$KAFKA_VERSION" "$(sha256sum "$SRC/pom.xml" | cut -d' ' -f1)"
}

ensure_libs() {
  if [[ -f "$STAMP" && -d "$LIBS" && "$(cat "$STAMP")" == "$(stamp_value)" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (needed to download Kafka $KAFKA_VERSION jars)"
  log "downloading Kafka $KAFKA_VERSION jars into $LIBS"
  mkdir -p "$CACHE"
  rm -f "$STAMP"
  rm -rf "$LIBS" "$LIBS.tmp"
  local start=$SECONDS
  if ! mvn -B -q -Dstyle.color=never -f "$SRC/pom.xml" \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -Dkafka.version="$KAFKA_VERSION" \
    -DoutputDirectory="$LIBS.tmp" -DincludeScope=runtime >"$CACHE/mvn.log" 2>&1; then
    rm -rf "$LIBS.tmp"
    tail -n 50 "$CACHE/mvn.log" >&2 || true
    die "maven download failed (full log: $CACHE/mvn.log)"
  fi
  [[ -f "$LIBS.tmp/kafka_2.13-$KAFKA_VERSION.jar" ]] \
    || { rm -rf "$LIBS.tmp"; die "kafka_2.13-$KAFKA_VERSION.jar missing after download"; }
  mv "$LIBS.tmp" "$LIBS"
  stamp_value >"$STAMP"
  log "downloaded $(find "$LIBS" -name '*.jar' | wc -l) jars ($(du -sh "$LIBS" | cut -f1)) in $((SECONDS - start)) s"
}

# --- process helpers --------------------------------------------------------

# is_ours PID: PID is alive and is a broker started with our config file.
is_ours() {
  local pid=$1 cmd comm=""
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  read -r comm <"/proc/$pid/comm" 2>/dev/null || return 1
  [[ "$comm" == java ]] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ "$cmd" == *" kafka.Kafka $CONF "* ]]
}

# find_pid: print the broker pid, from the pid file or, if that is gone,
# by looking for a java process started with our exact config path.
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

port_open() {
  (exec 3<>"/dev/tcp/$HOST/${1:-$PORT}") 2>/dev/null
}

# ports_free: fail early if something else holds the broker or controller port.
ports_free() {
  local p
  for p in "$PORT" "$CONTROLLER_PORT"; do
    if port_open "$p"; then
      die "$HOST:$p is already in use by another process (not the broker under $STATE)"
    fi
  done
}

# ready: our broker is alive, logged readiness and accepts connections.
ready() {
  find_pid >/dev/null || return 1
  grep -q "$READY_LINE" "$OUT" 2>/dev/null || return 1
  port_open
}

wait_ready() {
  local pid=$1 deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "broker (pid $pid) exited during startup; last 50 lines of $OUT:"
      tail -n 50 "$OUT" >&2 || true
      return 1
    fi
    if grep -q "$READY_LINE" "$OUT" 2>/dev/null && port_open; then
      return 0
    fi
    sleep 0.5
  done
  log "broker (pid $pid) not ready after ${READY_TIMEOUT}s; last 50 lines of $OUT:"
  tail -n 50 "$OUT" >&2 || true
  return 1
}

render_config() {
  mkdir -p "$STATE" "$LOGS"
  sed "s#@DATA_DIR@#$DATA#g" "$SRC/server.properties" >"$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
  cp "$SRC/log4j2.properties" "$LOG4J"
}

java_common() {
  printf '%s\n' "${JVM_OPTS[@]}" \
    "-Dlog4j2.configurationFile=$LOG4J" "-Dkafka.logs.dir=$LOGS" \
    -cp "$LIBS/*"
}

format_storage() {
  log "formatting $DATA (cluster id $CLUSTER_ID)"
  local opts
  mapfile -t opts < <(java_common)
  "$JAVA" "${opts[@]}" kafka.tools.StorageTool format \
    -t "$CLUSTER_ID" -c "$CONF" --ignore-formatted >&2 \
    || die "storage format failed"
}

# launch: start the broker in the background on the current data dir and
# wait for readiness. Kills it again if it does not become ready.
launch() {
  ports_free
  local opts pid start=$SECONDS
  mapfile -t opts < <(java_common)
  [[ -f "$OUT" ]] && mv -f "$OUT" "$OUT.prev"
  log "starting Kafka $KAFKA_VERSION on $BROKERS (log: $OUT)"
  # setsid+nohup: survive the calling shell; fd 9 (our lock) must not leak.
  setsid nohup "$JAVA" "${opts[@]}" kafka.Kafka "$CONF" \
    >"$OUT" 2>&1 </dev/null 8>&- 9>&- &
  pid=$!
  disown "$pid" 2>/dev/null || true
  # $! is java itself (setsid and nohup exec); fall back to a scan in case
  # setsid had to fork (caller with job control).
  local i
  for i in $(seq 1 100); do
    is_ours "$pid" && break
    if ! kill -0 "$pid" 2>/dev/null; then
      pid="$(find_pid)" || true
      [[ -n "$pid" ]] && break
    fi
    sleep 0.05
  done
  [[ -n "$pid" ]] || pid=$!
  echo "$pid" >"$PIDFILE"
  if ! wait_ready "$pid"; then
    stop_pid "$pid" KILL
    rm -f "$PIDFILE"
    die "Kafka did not start"
  fi
  log "Kafka ready on $BROKERS (pid $pid) after $((SECONDS - start)) s"
}

# stop_pid PID TERM|KILL
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
      log "broker (pid $pid) still alive after ${STOP_TIMEOUT}s, sending SIGKILL"
    fi
  fi
  kill -KILL "$pid" 2>/dev/null || true
  # Wait until it is really gone so the ports are free for a restart.
  local i
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
}

lock() {
  mkdir -p "$STATE"
  exec 9>"$STATE/.lock"
  flock 9
}

# --- commands -------------------------------------------------------------

cmd_up() {
  wait_tests_done kafka
  lock
  local pid
  if pid="$(find_pid)"; then
    if ready; then
      log "Kafka already running on $BROKERS (pid $pid)"
      return 0
    fi
    log "broker (pid $pid) is running but not ready; waiting"
    if wait_ready "$pid"; then
      log "Kafka ready on $BROKERS (pid $pid)"
      return 0
    fi
    log "restarting it"
    stop_pid "$pid" KILL
    rm -f "$PIDFILE"
  fi
  ports_free
  ensure_libs
  render_config
  rm -rf "$DATA"
  mkdir -p "$DATA"
  format_storage
  launch
}

cmd_start() {
  lock
  local pid
  if pid="$(find_pid)"; then
    if ready; then
      log "Kafka already running on $BROKERS (pid $pid)"
      return 0
    fi
    log "broker (pid $pid) is running but not ready; waiting"
    wait_ready "$pid" || die "Kafka did not become ready"
    return 0
  fi
  ports_free
  ensure_libs
  render_config
  if [[ ! -f "$DATA/meta.properties" ]]; then
    log "no formatted data dir at $DATA; creating a fresh one"
    rm -rf "$DATA"
    mkdir -p "$DATA"
    format_storage
  fi
  launch
}

cmd_down() {
  lock
  local pid
  if pid="$(find_pid)"; then
    log "stopping Kafka (pid $pid)"
    stop_pid "$pid" TERM
    log "stopped"
  else
    log "Kafka not running"
  fi
  rm -f "$PIDFILE"
}

cmd_kill() {
  lock
  local pid
  if pid="$(find_pid)"; then
    log "killing Kafka (pid $pid) with SIGKILL"
    stop_pid "$pid" KILL
  else
    log "Kafka not running"
  fi
  rm -f "$PIDFILE"
}

cmd_status() {
  local pid
  if pid="$(find_pid)" && ready; then
    log "Kafka running on $BROKERS (pid $pid)"
    return 0
  fi
  log "Kafka not running"
  return 1
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  env) echo "export IDEM_TEST_KAFKA_BROKERS=$BROKERS" ;;
  kill) cmd_kill ;;
  start) cmd_start ;;
  status) cmd_status ;;
  *)
    echo "usage: $0 up|down|env|kill|start|status" >&2
    exit 2
    ;;
esac
