#!/usr/bin/env bash
# A two-broker Apache RocketMQ cluster for the failover tests, from the same
# jars as rocketmq.sh: one name server and two broker groups, each a single
# master (brokerId 0), in one cluster (brokerClusterName idem-rmq-cluster).
# A topic created on the cluster has queues on both groups.
#
# Usage: scripts/testenv/rocketmq-cluster.sh <command>
#   up              start the name server and both brokers on fresh stores,
#                   unless those of an earlier `up` are running and
#                   registered; waits until both brokers are registered with
#                   the name server
#   down            stop the brokers, then the name server (SIGTERM, then
#                   SIGKILL after 30 s)
#   env             print the environment for the tests
#   kill N          kill -9 broker N (1 or 2; a crash); its store is kept
#   start [N]       start broker N (default: every broker not running, and the
#                   name server if it is down) again on its store, and wait
#                   until it is registered
#   status          exit 0 if the name server and both brokers run and both
#                   brokers are registered
#   topic NAME [QUEUES]  create/update a topic with QUEUES (default 4) read and
#                   write queues on each broker
#   admin ARGS...   run mqadmin (MQAdminStartup) with ARGS; -n defaults to
#                   the cluster's name server when omitted
#
# Name server 127.0.0.1:19876. Broker N is brokerName idem-rmq-a (N=1) or
# idem-rmq-b (N=2) on 127.0.0.1:(19911+1000N) — 20911 and 21911 — which
# also opens listenPort-2 (20909, 21909) and listenPort+1 (HA: 20912,
# 21912).
#
# Environment: IDEM_CACHE_DIR, IDEM_TESTENV_DIR, IDEM_ROCKETMQ_VERSION,
# IDEM_ROCKETMQ_READY_TIMEOUT, JAVA, MVN as for rocketmq.sh. State in
# $IDEM_TESTENV_DIR/rocketmq-cluster/{conf,logs,run,namesrv,broker1,broker2}
# (a server's home and store under its own dir). Progress messages go to
# stderr.
set -euo pipefail

NAMESRV_HOST=127.0.0.1
NAMESRV_PORT=19876
NAMESRV_ADDR="${NAMESRV_HOST}:${NAMESRV_PORT}"
CLUSTER_NAME=idem-rmq-cluster
BROKERS=(1 2)

STATE_DIR="${IDEM_TESTENV_DIR:-/tmp/idem-testenv}/rocketmq-cluster"

log() { printf '[rocketmq-cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=service_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/service_lib.sh"
# shellcheck source=rocketmq_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/rocketmq_lib.sh"

# The servers: namesrv, broker1, broker2 (see rocketmq_lib.sh).
server_kind() {
  case "$1" in
    namesrv) echo namesrv ;;
    broker[12]) echo broker ;;
    *) die "no server $1" ;;
  esac
}
server_home() { echo "${STATE_DIR}/$1"; }
server_port() {
  case "$1" in
    namesrv) echo "${NAMESRV_PORT}" ;;
    broker*) echo $((19911 + 1000 * ${1#broker})) ;;
  esac
}
server_heap() {
  case "$(server_kind "$1")" in
    namesrv) printf '%s\n' -Xms128m -Xmx128m ;;
    broker) printf '%s\n' -Xms256m -Xmx256m -XX:MaxDirectMemorySize=128m ;;
  esac
}

broker_name() { # $1 = 1|2
  case "$1" in
    1) echo idem-rmq-a ;;
    2) echo idem-rmq-b ;;
  esac
}

check_broker() { # $1 = N
  [[ "$1" =~ ^[12]$ ]] || die "no broker '$1' (want 1 or 2)"
}

render_all() {
  mkdir -p "${CONF_DIR}" "${LOG_DIR}" "${RUN_DIR}"
  render namesrv.conf namesrv "$(server_home namesrv)" \
    -e "s|^listenPort=.*|listenPort=${NAMESRV_PORT}|"
  local n
  for n in "${BROKERS[@]}"; do
    render broker.conf "broker${n}" "$(server_home "broker${n}")" \
      -e "s|^brokerClusterName=.*|brokerClusterName=${CLUSTER_NAME}|" \
      -e "s|^brokerName=.*|brokerName=$(broker_name "${n}")|" \
      -e "s|^namesrvAddr=.*|namesrvAddr=${NAMESRV_ADDR}|" \
      -e "s|^listenPort=.*|listenPort=$(server_port "broker${n}")|"
  done
  cp "${TEMPLATE_DIR}/logback.xml" "${CONF_DIR}/logback.xml"
}

# registered: the brokers the name server lists in the cluster (mqadmin
# clusterList), by name, one a line.
registered() {
  run_admin clusterList -n "${NAMESRV_ADDR}" -c "${CLUSTER_NAME}" 2>/dev/null \
    | awk -v c="${CLUSTER_NAME}" '$1 == c {print $2}' | sort -u
}

# wait_registered: until both brokers are in the name server's cluster
# list (each launch already waited for its broker's "registration
# completed" log line; this asks the name server).
wait_registered() {
  local start=${SECONDS} got want
  want="$(for n in "${BROKERS[@]}"; do broker_name "${n}"; done | sort | tr '\n' ' ')"
  while :; do
    got="$(registered | tr '\n' ' ')" || true
    if [[ "${got}" == "${want}" ]]; then
      log "the name server ${NAMESRV_ADDR} lists both brokers (${got% }) after $((SECONDS - start))s"
      return 0
    fi
    if (( SECONDS - start >= READY_TIMEOUT )); then
      die "the name server lists '${got% }' after ${READY_TIMEOUT}s, want '${want% }'"
    fi
    sleep 1
  done
}

all_alive() {
  local s
  for s in namesrv broker1 broker2; do
    alive_pid "${s}" >/dev/null || return 1
  done
}

# ---------------------------------------------------------------- commands

cmd_up() {
  if all_alive && [[ "$(registered | wc -l)" -eq 2 ]]; then
    log "already running (name server ${NAMESRV_ADDR}, brokers $(brokers_addrs)); nothing to do"
    return 0
  fi
  ensure_jars
  fresh_state broker1 broker2 namesrv
  render_all
  launch namesrv || { stop_one namesrv term; exit 1; }
  launch_brokers "${BROKERS[@]}" || { cmd_down; exit 1; }
  wait_registered
}

# launch_brokers N...: start the brokers side by side (each waits about
# 10 s for its first registration) and wait until each is up.
launch_brokers() {
  local n failed=0
  local -a pids=()
  for n in "$@"; do
    launch "broker${n}" &
    pids+=($!)
  done
  for n in "${pids[@]}"; do
    wait "${n}" || failed=1
  done
  return "${failed}"
}

cmd_down() {
  local n
  for n in "${BROKERS[@]}"; do stop_one "broker${n}" term; done
  stop_one namesrv term
}

cmd_kill() {
  check_broker "${1:-}"
  crash_one "broker$1" "broker $1"
}

cmd_start() {
  [[ -z "${1:-}" ]] || check_broker "$1"
  [[ -f "$(conf_file broker1)" && -f "$(conf_file broker2)" ]] \
    || die "no state in ${STATE_DIR}; run '$0 up' first"
  start_namesrv
  local n
  local -a todo=()
  for n in ${1:-"${BROKERS[@]}"}; do
    if alive_pid "broker${n}" >/dev/null; then
      log "broker ${n} already running"
    else
      todo+=("${n}")
    fi
  done
  if (( ${#todo[@]} > 0 )); then
    launch_brokers "${todo[@]}" || { for n in "${todo[@]}"; do stop_one "broker${n}" term; done; exit 1; }
  fi
  wait_registered
}

cmd_status() {
  local rc=0
  print_status namesrv broker1 broker2 || rc=1
  if (( rc == 0 )); then
    local got
    got="$(registered | tr '\n' ' ')"
    echo "registered with ${NAMESRV_ADDR}: ${got% }"
    [[ "$(wc -w <<<"${got}")" -eq 2 ]] || rc=1
  fi
  return "${rc}"
}

brokers_addrs() {
  local n out=()
  for n in "${BROKERS[@]}"; do out+=("${NAMESRV_HOST}:$(server_port "broker${n}")"); done
  (IFS=,; echo "${out[*]}")
}

cmd_admin() {
  [[ $# -gt 0 ]] || die "usage: $0 admin SUBCOMMAND [ARGS...]"
  local a
  for a in "$@"; do
    [[ "${a}" == -n ]] && { run_admin "$@"; return; }
  done
  local sub="$1"
  shift
  run_admin "${sub}" -n "${NAMESRV_ADDR}" "$@"
}

cmd_topic() {
  [[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 topic NAME [QUEUES]"
  all_alive || die "the cluster is not running; run '$0 up' first"
  create_topic "${CLUSTER_NAME}" "$1" "${2:-4}"
}

cmd_env() {
  echo "export IDEM_TEST_ROCKETMQ_CLUSTER=${NAMESRV_ADDR}"
}

# A test holding the cluster (testenv.RocketMQClusterExclusive) may have a
# broker down on purpose and brings it back itself: an `up` from another
# checkout waits instead of starting a fresh cluster under it, and a `down`
# instead of stopping it under the test.
case "${1:-}" in
  up | down) wait_tests_done rocketmq-cluster ;;
esac
rocketmq_command "$@"
