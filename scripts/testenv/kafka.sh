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

HOST=127.0.0.1
PORT=9092
CONTROLLER_PORT=9093 # must match testdata/brokers/kafka/server.properties
BROKERS="$HOST:$PORT"
# Any base64url-encoded 16-byte UUID works; the data dir is fresh on `up`.
CLUSTER_ID=ax46DD9NSo6beiwdDl96kA

STATE="${IDEM_TESTENV_DIR:-/tmp/idem-testenv}/kafka"
HEAP=(-Xms256m -Xmx512m)
SED_ARGS=()

log() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=service_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/service_lib.sh"
# shellcheck source=kafka_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
node_files

# --- commands -------------------------------------------------------------

cmd_up() {
  wait_tests_done kafka
  lock
  local pid
  if pid="$(find_pid)" && config_changed; then
    if unused_by_tests; then
      log "broker (pid $pid) runs on data made with an older server.properties; starting a fresh one"
      stop_pid "$pid" KILL
      rm -f "$PIDFILE"
    else
      log "warning: broker (pid $pid) runs on data made with an older server.properties, but tests use it; keeping it"
    fi
  fi
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
  format_storage "$CLUSTER_ID"
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
    format_storage "$CLUSTER_ID"
  fi
  launch
}

cmd_down() {
  stop_server Kafka
  rm -f "$PIDFILE"
}

cmd_kill() {
  kill_server Kafka
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

run_command "export IDEM_TEST_KAFKA_BROKERS=$BROKERS" "$@"
