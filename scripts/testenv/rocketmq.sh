#!/usr/bin/env bash
# Local Apache RocketMQ (name server + broker) for integration tests, without Docker.
#
# Needs a JDK (17 tested) and Maven (3.8.7 tested; only used to fetch the jars
# from Maven's configured repositories through testdata/brokers/rocketmq/pom.xml).
#
# Usage: scripts/testenv/rocketmq.sh <command>
#   up                 start name server (127.0.0.1:9876) and broker (127.0.0.1:10911)
#                      on a fresh store; a no-op if both from an earlier `up` are alive
#   down               stop broker, then name server (SIGTERM, then SIGKILL after 30 s)
#   env                print the environment for the Go tests
#   topic NAME [QUEUES] create/update a topic (default 4 read/write queues)
#   admin ARGS...      run mqadmin (MQAdminStartup) with ARGS, e.g.
#                        admin sendMessage -n 127.0.0.1:9876 -t T -p hello -k key1
#                        admin queryMsgByKey -n 127.0.0.1:9876 -t T -k key1
#                      -n defaults to 127.0.0.1:9876 when omitted.
#                      NOTE: mqadmin exits 0 even when the sub-command fails; check its output.
#   kill               kill -9 the broker (crash test); store is kept
#   start              start the broker (and the name server if it is down) again
#                      on the existing store
#   status             print which servers are running
#
# Environment:
#   IDEM_CACHE_DIR      jar cache root (default $HOME/.cache/idem); jars go to
#                       $IDEM_CACHE_DIR/rocketmq-<version>/lib
#   IDEM_TESTENV_DIR    runtime state root (default /tmp/idem-testenv); this script
#                       uses $IDEM_TESTENV_DIR/rocketmq/{conf,store,logs,run,...}
#   IDEM_ROCKETMQ_VERSION  RocketMQ version (default 5.3.3)
#   IDEM_ROCKETMQ_READY_TIMEOUT  seconds a starting server may stay silent (default 90)
#   IDEM_ROCKETMQ_READY_CAP      seconds a server may take to start in all (default 420)
#   JAVA, MVN           java / mvn executables (default: from PATH)
#
# The jars and a server's life are in rocketmq_lib.sh (shared with
# rocketmq-cluster.sh).
#
# Logs: $IDEM_TESTENV_DIR/rocketmq/logs/{namesrv,broker}.out (stdout/stderr, incl.
# the "boot success" lines) and {namesrv,broker,admin}.log (logback).
# All progress messages go to stderr; only `env` and `admin`/`topic`/`status`
# output go to stdout.
set -euo pipefail

NAMESRV_HOST=127.0.0.1
NAMESRV_PORT=9876
BROKER_PORT=10911
NAMESRV_ADDR="${NAMESRV_HOST}:${NAMESRV_PORT}"
BROKER_ADDR="${NAMESRV_HOST}:${BROKER_PORT}"
CLUSTER_NAME=DefaultCluster

STATE_DIR="${IDEM_TESTENV_DIR:-/tmp/idem-testenv}/rocketmq"
# The state lock (lock_state) serializes up/down/kill/start (e.g. several
# `go test` packages calling `up` at once). It is kept when the rest of the
# state dir is wiped.

log() { printf '[rocketmq] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# shellcheck source=rocketmq_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/rocketmq_lib.sh"

# The two servers, namesrv and broker (see rocketmq_lib.sh).
server_kind() { echo "$1"; }
server_home() { echo "${STATE_DIR}"; }
server_port() {
  case "$1" in
    namesrv) echo "${NAMESRV_PORT}" ;;
    broker) echo "${BROKER_PORT}" ;;
  esac
}
server_heap() {
  case "$1" in
    namesrv) printf '%s\n' -Xms128m -Xmx256m ;;
    broker) printf '%s\n' -Xms256m -Xmx512m -XX:MaxDirectMemorySize=256m ;;
  esac
}

# ---------------------------------------------------------------- commands

cmd_up() {
  if alive_pid namesrv >/dev/null && alive_pid broker >/dev/null; then
    log "already running (name server ${NAMESRV_ADDR}, broker ${BROKER_ADDR}); nothing to do"
    return 0
  fi
  ensure_jars
  fresh_state broker namesrv
  mkdir -p "${CONF_DIR}" "${LOG_DIR}" "${RUN_DIR}" "${STATE_DIR}/store"
  render namesrv.conf namesrv "${STATE_DIR}"
  render broker.conf broker "${STATE_DIR}"
  cp "${TEMPLATE_DIR}/logback.xml" "${CONF_DIR}/logback.xml"
  launch namesrv || { stop_one namesrv term; exit 1; }
  launch broker || { stop_one broker term; stop_one namesrv term; exit 1; }
}

cmd_down() {
  stop_one broker term
  stop_one namesrv term
}

cmd_kill() {
  crash_one broker broker
}

cmd_start() {
  [[ -f "${CONF_DIR}/broker.conf" && -d "${STATE_DIR}/store" ]] \
    || die "no state in ${STATE_DIR}; run '$0 up' first"
  start_namesrv
  if alive_pid broker >/dev/null; then
    log "broker already running"
    return 0
  fi
  launch broker || { stop_one broker term; exit 1; }
}

cmd_status() {
  print_status namesrv broker
}

cmd_env() {
  echo "export IDEM_TEST_ROCKETMQ_NAMESRV=${NAMESRV_ADDR}"
}

cmd_admin() {
  [[ $# -gt 0 ]] || die "usage: $0 admin SUBCOMMAND [ARGS...]"
  run_admin "$@"
}

cmd_topic() {
  [[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 topic NAME [QUEUES]"
  alive_pid broker >/dev/null || die "broker is not running; run '$0 up' first"
  create_topic "${CLUSTER_NAME}" "$1" "${2:-4}"
}

rocketmq_command "$@"
