#!/usr/bin/env bash
# Three-node Apache Kafka cluster (KRaft, each node broker+controller, a
# 3-voter quorum) for the failover tests, from the same jars as kafka.sh.
#
# Usage: scripts/testenv/kafka-cluster.sh up|down|env|kill N|start [N]|status|controller
#   up          start a fresh cluster (new data dirs) unless the three nodes
#               of an earlier `up` are running and answering; waits until
#               all three are ready and the quorum has a leader
#   down        stop the nodes (SIGTERM, up to 30 s each, then SIGKILL)
#   env         print the environment for the tests
#   kill N      kill -9 node N (1-3; simulated crash); its data dir is kept
#   start [N]   start node N (default: every node not running) again on its
#               data dir
#   status      exit 0 if all three nodes are running and answering
#   controller  print the node ID of the quorum's leader (the active
#               controller)
#
# Node N listens on 127.0.0.1:(19090+2N) (clients) and :(19091+2N)
# (controller): 19092/19093, 19094/19095, 19096/19097.
#
# Environment: IDEM_CACHE_DIR, IDEM_TESTENV_DIR, IDEM_KAFKA_VERSION as for
# kafka.sh. Progress messages go to stderr.
set -euo pipefail

NODES=(1 2 3)
HOST=127.0.0.1
BASE_PORT=19090
CLUSTER_ID=c3cvVAtDSa6ZBNGEaXp0Ug
CLUSTER_STATE="${IDEM_TESTENV_DIR:-/tmp/idem-testenv}/kafka-cluster"
HEAP=(-Xms128m -Xmx384m)

log() { printf 'kafka-cluster.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
# shellcheck source=service_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/service_lib.sh"
# shellcheck source=kafka_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"

port_of() { echo $((BASE_PORT + 2 * $1)); }

brokers() {
  local n out=()
  for n in "${NODES[@]}"; do out+=("$HOST:$(port_of "$n")"); done
  (IFS=,; echo "${out[*]}")
}

voters() {
  local n out=()
  for n in "${NODES[@]}"; do out+=("$n@$HOST:$(($(port_of "$n") + 1))"); done
  (IFS=,; echo "${out[*]}")
}

# node N: point kafka_lib's variables at node N.
node() {
  [[ "$1" =~ ^[1-3]$ ]] || die "no node $1 (want 1, 2 or 3)"
  NODE=$1
  PORT=$(port_of "$1")
  CONTROLLER_PORT=$((PORT + 1))
  STATE="$CLUSTER_STATE/node$1"
  node_files
  SED_ARGS=(-e "s#@NODE_ID@#$1#g" -e "s#@PORT@#$PORT#g" -e "s#@CONTROLLER_PORT@#$CONTROLLER_PORT#g" -e "s#@VOTERS@#$(voters)#g")
}

# spawn_nodes N...: start the nodes (on their data dirs) and wait until
# each is ready. A node of a combined-mode quorum is ready only once a
# majority of the voters runs, so they start together.
spawn_nodes() {
  local n pid start=$SECONDS failed=0
  for n in "$@"; do
    node "$n"
    render_config "$SRC/cluster.properties"
    spawn
  done
  for n in "$@"; do
    node "$n"
    pid=$(cat "$PIDFILE")
    if wait_ready "$pid"; then
      log "node $n ready on $HOST:$PORT (pid $pid) after $((SECONDS - start)) s"
    else
      failed=1
    fi
  done
  if ((failed)); then
    for n in "$@"; do
      node "$n"
      stop_pid "$(cat "$PIDFILE")" KILL
      rm -f "$PIDFILE"
    done
    die "the cluster did not start"
  fi
}

# running: the nodes whose process runs; ready_all: all three answer.
running() {
  local n
  for n in "${NODES[@]}"; do
    node "$n"
    if find_pid >/dev/null; then echo "$n"; fi
  done
}

ready_all() {
  local n
  for n in "${NODES[@]}"; do
    node "$n"
    ready || return 1
  done
}

tool_java() {
  node 1
  "$JAVA" -Xmx128m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC \
    "-Dlog4j2.configurationFile=$LOG4J" -cp "$LIBS/*" "$@"
}

# leader: the quorum's leader, asked of any running node; fails while
# there is none.
leader() {
  local out id
  out=$(tool_java org.apache.kafka.tools.MetadataQuorumCommand \
    --bootstrap-server "$(brokers)" describe --status 2>&1) || { log "$out"; return 1; }
  id=$(awk -F': *' '$1 == "LeaderId" {print $2}' <<<"$out")
  [[ "$id" =~ ^[0-9]+$ && "$id" -ge 0 ]] || { log "no quorum leader: $out"; return 1; }
  echo "$id"
}

wait_leader() {
  local id deadline=$((SECONDS + READY_TIMEOUT))
  while ((SECONDS < deadline)); do
    if id=$(leader); then
      log "quorum leader (active controller): node $id"
      return 0
    fi
    sleep 1
  done
  die "the quorum has no leader after ${READY_TIMEOUT}s"
}

# --- commands -------------------------------------------------------------

cmd_up() {
  wait_tests_done kafka-cluster
  lock "$CLUSTER_STATE"
  local n pid stale=""
  for n in "${NODES[@]}"; do
    node "$n"
    if find_pid >/dev/null && config_changed "$SRC/cluster.properties"; then
      stale=1
    fi
  done
  if [[ -z "$stale" ]] && ready_all; then
    log "Kafka cluster already running on $(brokers)"
    return 0
  fi
  if [[ -n "$stale" ]] && ! unused_by_tests; then
    log "warning: the cluster runs on data made with an older server.properties, but tests use it; keeping it"
    stale=""
  elif [[ -n "$stale" ]]; then
    log "the cluster runs on data made with an older server.properties; starting a fresh one"
  fi
  if [[ -z "$stale" ]]; then
    for n in $(running); do
      node "$n"
      pid=$(find_pid) || continue
      log "node $n (pid $pid) is running but the cluster is not ready; waiting"
      wait_ready "$pid" || true
    done
  fi
  if [[ -z "$stale" ]] && ready_all; then
    wait_leader
    log "Kafka cluster ready on $(brokers)"
    return 0
  fi
  log "starting a fresh cluster"
  for n in $(running); do
    node "$n"
    stop_pid "$(find_pid)" KILL
    rm -f "$PIDFILE"
  done
  for n in "${NODES[@]}"; do
    node "$n"
    ports_free
  done
  ensure_libs
  for n in "${NODES[@]}"; do
    node "$n"
    render_config "$SRC/cluster.properties"
    format_storage "$CLUSTER_ID"
  done
  spawn_nodes "${NODES[@]}"
  wait_leader
  log "Kafka cluster ready on $(brokers)"
}

cmd_start() {
  lock "$CLUSTER_STATE"
  local n todo=()
  for n in ${1:-"${NODES[@]}"}; do
    node "$n"
    if find_pid >/dev/null; then
      ready || wait_ready "$(find_pid)" || die "node $n did not become ready"
      continue
    fi
    [[ -f "$DATA/meta.properties" ]] || die "node $n has no formatted data dir at $DATA: run up"
    todo+=("$n")
  done
  ((${#todo[@]} == 0)) && { log "nodes ${1:-1-3} already running"; return 0; }
  ensure_libs
  spawn_nodes "${todo[@]}"
}

cmd_kill() {
  [[ -n "${1:-}" ]] || die "kill needs a node (1, 2 or 3)"
  lock "$CLUSTER_STATE"
  node "$1"
  local pid
  if pid="$(find_pid)"; then
    log "killing node $1 (pid $pid) with SIGKILL"
    stop_pid "$pid" KILL
  else
    log "node $1 not running"
  fi
  rm -f "$PIDFILE"
}

cmd_down() {
  wait_tests_done kafka-cluster
  lock "$CLUSTER_STATE"
  local n pid
  # SIGTERM to all first: a node shutting down alone waits for the
  # others to take over its partitions.
  for n in "${NODES[@]}"; do
    node "$n"
    if pid="$(find_pid)"; then
      log "stopping node $n (pid $pid)"
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done
  for n in "${NODES[@]}"; do
    node "$n"
    if pid="$(find_pid)"; then stop_pid "$pid" TERM; fi
    rm -f "$PIDFILE"
  done
  log "stopped"
}

cmd_status() {
  if ready_all; then
    log "Kafka cluster running on $(brokers)"
    return 0
  fi
  log "Kafka cluster not (fully) running; nodes running: $(running | tr '\n' ' ')"
  return 1
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  env) echo "export IDEM_TEST_KAFKA_CLUSTER=$(brokers)" ;;
  kill) cmd_kill "${2:-}" ;;
  start) cmd_start "${2:-}" ;;
  status) cmd_status ;;
  controller) node 1; leader ;;
  *)
    echo "usage: $0 up|down|env|kill N|start [N]|status|controller" >&2
    exit 2
    ;;
esac
