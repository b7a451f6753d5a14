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
#   IDEM_ROCKETMQ_READY_TIMEOUT  seconds to wait for each server (default 90)
#   JAVA, MVN           java / mvn executables (default: from PATH)
#
# Logs: $IDEM_TESTENV_DIR/rocketmq/logs/{namesrv,broker}.out (stdout/stderr, incl.
# the "boot success" lines) and {namesrv,broker,admin}.log (logback).
# All progress messages go to stderr; only `env` and `admin`/`topic`/`status`
# output go to stdout.
set -euo pipefail

ROCKETMQ_VERSION="${IDEM_ROCKETMQ_VERSION:-5.3.3}"
JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"

NAMESRV_HOST=127.0.0.1
NAMESRV_PORT=9876
BROKER_PORT=10911
NAMESRV_ADDR="${NAMESRV_HOST}:${NAMESRV_PORT}"
BROKER_ADDR="${NAMESRV_HOST}:${BROKER_PORT}"
CLUSTER_NAME=DefaultCluster
READY_TIMEOUT="${IDEM_ROCKETMQ_READY_TIMEOUT:-90}" # seconds, per server
STOP_TIMEOUT=30  # seconds, per server

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/../.." && pwd)"
TEMPLATE_DIR="${REPO_ROOT}/testdata/brokers/rocketmq"

CACHE_DIR="${IDEM_CACHE_DIR:-${HOME}/.cache/idem}/rocketmq-${ROCKETMQ_VERSION}"
LIB_DIR="${CACHE_DIR}/lib"
LIB_STAMP="${CACHE_DIR}/lib.complete"

STATE_DIR="${IDEM_TESTENV_DIR:-/tmp/idem-testenv}/rocketmq"
CONF_DIR="${STATE_DIR}/conf"
LOG_DIR="${STATE_DIR}/logs"
RUN_DIR="${STATE_DIR}/run"
# Serializes up/down/kill/start (e.g. several `go test` packages calling `up`
# at once). Kept when the rest of the state dir is wiped.
LOCK_FILE="${STATE_DIR}/.lock"

NAMESRV_MAIN=org.apache.rocketmq.namesrv.NamesrvStartup
BROKER_MAIN=org.apache.rocketmq.broker.BrokerStartup
ADMIN_MAIN=org.apache.rocketmq.tools.command.MQAdminStartup

log() { printf '[rocketmq] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Takes the state lock on fd 9 (released when this script exits). Children
# started while holding it must close fd 9 (see launch).
lock_state() {
  mkdir -p "${STATE_DIR}"
  exec 9>>"${LOCK_FILE}"
  if ! flock -n 9; then
    log "waiting for another rocketmq.sh to finish ..."
    flock -w 300 9 || die "timed out waiting for ${LOCK_FILE}"
  fi
}

# ---------------------------------------------------------------- jars

ensure_jars() {
  if [[ -f "${LIB_STAMP}" ]] && compgen -G "${LIB_DIR}/rocketmq-broker-${ROCKETMQ_VERSION}.jar" >/dev/null; then
    return 0
  fi
  command -v "${MVN}" >/dev/null 2>&1 || die "mvn not found (needed once to fetch the RocketMQ jars)"
  log "downloading RocketMQ ${ROCKETMQ_VERSION} jars into ${LIB_DIR} ..."
  local tmp="${CACHE_DIR}/lib.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  local start=${SECONDS}
  local mvn_log="${CACHE_DIR}/mvn.log"
  if ! "${MVN}" -B -q -f "${TEMPLATE_DIR}/pom.xml" \
      "-Drocketmq.version=${ROCKETMQ_VERSION}" \
      org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
      "-DoutputDirectory=${tmp}" -DincludeScope=runtime >"${mvn_log}" 2>&1; then
    tail -n 50 "${mvn_log}" >&2
    rm -rf "${tmp}"
    die "maven could not fetch the RocketMQ ${ROCKETMQ_VERSION} jars (full output: ${mvn_log})"
  fi
  [[ -f "${tmp}/rocketmq-broker-${ROCKETMQ_VERSION}.jar" && -f "${tmp}/rocketmq-namesrv-${ROCKETMQ_VERSION}.jar" \
     && -f "${tmp}/rocketmq-tools-${ROCKETMQ_VERSION}.jar" ]] \
    || { rm -rf "${tmp}"; die "maven finished but the RocketMQ jars are missing"; }
  rm -rf "${LIB_DIR}"
  mv "${tmp}" "${LIB_DIR}"
  date -u +%Y-%m-%dT%H:%M:%SZ >"${LIB_STAMP}"
  log "downloaded $(find "${LIB_DIR}" -name '*.jar' | wc -l) jars ($(du -sh "${LIB_DIR}" | cut -f1)) in $((SECONDS - start))s"
}

# ---------------------------------------------------------------- java

# Options shared by all three JVMs. user.home and rocketmq.home.dir point into
# the state dir so nothing is written to the real home directory (RocketMQ
# hangs ~/store, ~/namesrv and ~/logs off user.home and refuses to start
# without rocketmq.home.dir).
common_jvm_opts() { # $1 = log name
  printf '%s\n' \
    "-Duser.home=${STATE_DIR}" \
    "-Drocketmq.home.dir=${STATE_DIR}" \
    "-Drmq.logback.configurationFile=${CONF_DIR}/logback.xml" \
    "-Didem.rocketmq.logFile=${LOG_DIR}/$1.log" \
    "-Drocketmq.namesrv.addr=${NAMESRV_ADDR}" \
    "-Djava.net.preferIPv4Stack=true" \
    "-Dfile.encoding=UTF-8" \
    "-XX:+UseG1GC" \
    "-XX:-OmitStackTraceInFastThrow" \
    "-XX:ErrorFile=${LOG_DIR}/hs_err_$1_%p.log"
}

classpath() { printf '%s/*' "${LIB_DIR}"; }

# ---------------------------------------------------------------- processes

pid_file() { printf '%s/%s.pid' "${RUN_DIR}" "$1"; }

main_class_of() {
  case "$1" in
    namesrv) echo "${NAMESRV_MAIN}" ;;
    broker) echo "${BROKER_MAIN}" ;;
  esac
}

# True if process $2 is server $1 of THIS state dir (guards against pid reuse
# and against other users' RocketMQ processes).
is_our_server() { # $1 = namesrv|broker, $2 = pid
  local cmdline
  cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$2/cmdline" || true)"
  [[ "${cmdline}" == *" $(main_class_of "$1") "* && "${cmdline}" == *" -Duser.home=${STATE_DIR} "* ]]
}

# Prints the pid of server $1 if it is alive. Uses the pid file, falling back
# to a scan of /proc (e.g. when the state dir was deleted under a running server).
alive_pid() {
  local f pid
  f="$(pid_file "$1")"
  if [[ -f "${f}" ]]; then
    pid="$(cat "${f}" 2>/dev/null || true)"
    if [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null && is_our_server "$1" "${pid}"; then
      echo "${pid}"
      return 0
    fi
  fi
  local d comm
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    comm=""
    read -r comm 2>/dev/null <"${d}/comm" || true
    [[ "${comm}" == java ]] || continue
    if is_our_server "$1" "${pid}"; then
      echo "${pid}"
      return 0
    fi
  done
  return 1
}

port_in_use() { # $1 = port
  (exec 3<>"/dev/tcp/${NAMESRV_HOST}/$1") 2>/dev/null
}

render() { # $1 = template name
  sed "s|@STATE_DIR@|${STATE_DIR}|g" "${TEMPLATE_DIR}/$1" >"${CONF_DIR}/$1"
}

dump_logs() { # $1 = server name
  local f
  for f in "${LOG_DIR}/$1.out" "${LOG_DIR}/$1.log"; do
    [[ -f "${f}" ]] || continue
    printf '\n----- last 50 lines of %s -----\n' "${f}" >&2
    tail -n 50 "${f}" >&2
  done
}

# Starts server $1 in the background (own session, survives this script) and
# waits until it prints its readiness line.
launch() { # $1 = namesrv|broker
  local name="$1" main conf ready port pid registered="" extra_ports=""
  local -a heap
  case "${name}" in
    namesrv)
      main="${NAMESRV_MAIN}"; conf="${CONF_DIR}/namesrv.conf"; port="${NAMESRV_PORT}"
      ready='The Name Server boot success'
      heap=(-Xms128m -Xmx256m)
      ;;
    broker)
      main="${BROKER_MAIN}"; conf="${CONF_DIR}/broker.conf"; port="${BROKER_PORT}"
      ready='boot success'
      # "boot success" is printed BEFORE the broker is known to the name
      # server: in 5.3.3 the registration attempted inside start() finds no
      # "available" name server yet (that list is filled asynchronously) and
      # is skipped, so the first registration is the periodic one ~10 s
      # later. Until then clients get "route info not found" and mqadmin
      # cannot find the cluster, so also wait for that log line.
      registered='Registering current broker to name server completed'
      # listenPort-2 ("fast"/VIP channel) and listenPort+1 (HA).
      extra_ports="$((BROKER_PORT - 2)) $((BROKER_PORT + 1))"
      heap=(-Xms256m -Xmx512m -XX:MaxDirectMemorySize=256m)
      ;;
  esac
  local p
  for p in "${port}" ${extra_ports}; do
    if port_in_use "${p}"; then
      log "${NAMESRV_HOST}:${p} is already in use by a process this script did not start (stop it first)"
      return 1
    fi
  done
  local out="${LOG_DIR}/${name}.out" logf="${LOG_DIR}/${name}.log"
  [[ -f "${out}" ]] && mv -f "${out}" "${out}.prev"
  # Only look at log lines written by this launch (the .log is appended to).
  local log_off=0
  [[ -f "${logf}" ]] && log_off="$(stat -c %s "${logf}")"
  local -a opts
  mapfile -t opts < <(common_jvm_opts "${name}")
  log "starting ${name} ..."
  local start=${SECONDS}
  (
    cd "${STATE_DIR}"
    # 9>&-: the server must not inherit (and keep holding) the state lock.
    exec setsid nohup "${JAVA}" "${heap[@]}" "${opts[@]}" -cp "$(classpath)" "${main}" -c "${conf}" \
      </dev/null >"${out}" 2>&1 9>&-
  ) &
  pid=$!
  echo "${pid}" >"$(pid_file "${name}")"
  local booted=""
  while :; do
    if [[ -z "${booted}" ]] && grep -q "${ready}" "${out}" 2>/dev/null; then
      booted=1
      if [[ -n "${registered}" ]]; then
        log "${name} booted after $((SECONDS - start))s; waiting for it to register with the name server ..."
      fi
    fi
    if [[ -n "${booted}" ]] && { [[ -z "${registered}" ]] \
        || grep -q "${registered}" < <(tail -c "+$((log_off + 1))" "${logf}" 2>/dev/null); }; then
      log "${name} is up (pid ${pid}, ${NAMESRV_HOST}:${port}) after $((SECONDS - start))s"
      return 0
    fi
    if ! kill -0 "${pid}" 2>/dev/null; then
      log "${name} exited before it was ready"
      dump_logs "${name}"
      return 1
    fi
    if (( SECONDS - start >= READY_TIMEOUT )); then
      log "${name} not ready after ${READY_TIMEOUT}s"
      dump_logs "${name}"
      return 1
    fi
    sleep 0.3
  done
}

stop_one() { # $1 = namesrv|broker, $2 = signal mode: term|kill
  local name="$1" pid
  if ! pid="$(alive_pid "${name}")"; then
    rm -f "$(pid_file "${name}")"
    return 0
  fi
  if [[ "$2" == kill ]]; then
    log "kill -9 ${name} (pid ${pid})"
    kill -9 "${pid}" 2>/dev/null || true
  else
    log "stopping ${name} (pid ${pid}) ..."
    kill -TERM "${pid}" 2>/dev/null || true
    local start=${SECONDS}
    while kill -0 "${pid}" 2>/dev/null && (( SECONDS - start < STOP_TIMEOUT )); do
      sleep 0.2
    done
    if kill -0 "${pid}" 2>/dev/null; then
      log "${name} did not stop within ${STOP_TIMEOUT}s; sending SIGKILL"
      kill -9 "${pid}" 2>/dev/null || true
    fi
  fi
  # Wait for the process to be gone (and its ports released).
  local i
  for i in $(seq 1 100); do
    kill -0 "${pid}" 2>/dev/null || break
    sleep 0.1
  done
  rm -f "$(pid_file "${name}")"
  log "${name} stopped"
}

# ---------------------------------------------------------------- commands

cmd_up() {
  if alive_pid namesrv >/dev/null && alive_pid broker >/dev/null; then
    log "already running (name server ${NAMESRV_ADDR}, broker ${BROKER_ADDR}); nothing to do"
    return 0
  fi
  ensure_jars
  # Leftovers of a half-started or half-dead environment: stop them first.
  stop_one broker term
  stop_one namesrv term
  local p
  for p in "${NAMESRV_PORT}" "${BROKER_PORT}" "$((BROKER_PORT - 2))" "$((BROKER_PORT + 1))"; do
    if port_in_use "${p}"; then
      die "${NAMESRV_HOST}:${p} is already in use by a process this script did not start (stop it first)"
    fi
  done
  # Fresh state on every real `up` (everything but the lock file).
  find "${STATE_DIR}" -mindepth 1 -maxdepth 1 ! -name .lock -exec rm -rf {} +
  mkdir -p "${CONF_DIR}" "${LOG_DIR}" "${RUN_DIR}" "${STATE_DIR}/store"
  render namesrv.conf
  render broker.conf
  cp "${TEMPLATE_DIR}/logback.xml" "${CONF_DIR}/logback.xml"
  launch namesrv || { stop_one namesrv term; exit 1; }
  launch broker || { stop_one broker term; stop_one namesrv term; exit 1; }
}

cmd_down() {
  stop_one broker term
  stop_one namesrv term
}

cmd_kill() {
  if ! alive_pid broker >/dev/null; then
    log "broker is not running"
    return 0
  fi
  stop_one broker kill
}

cmd_start() {
  [[ -f "${CONF_DIR}/broker.conf" && -d "${STATE_DIR}/store" ]] \
    || die "no state in ${STATE_DIR}; run '$0 up' first"
  ensure_jars
  mkdir -p "${LOG_DIR}" "${RUN_DIR}"
  if ! alive_pid namesrv >/dev/null; then
    launch namesrv || { stop_one namesrv term; exit 1; }
  fi
  if alive_pid broker >/dev/null; then
    log "broker already running"
    return 0
  fi
  launch broker || { stop_one broker term; exit 1; }
}

cmd_status() {
  local name pid rc=0
  for name in namesrv broker; do
    if pid="$(alive_pid "${name}")"; then
      echo "${name}: running (pid ${pid})"
    else
      echo "${name}: stopped"
      rc=1
    fi
  done
  return "${rc}"
}

cmd_env() {
  echo "export IDEM_TEST_ROCKETMQ_NAMESRV=${NAMESRV_ADDR}"
}

run_admin() {
  ensure_jars
  mkdir -p "${LOG_DIR}" "${CONF_DIR}"
  [[ -f "${CONF_DIR}/logback.xml" ]] || cp "${TEMPLATE_DIR}/logback.xml" "${CONF_DIR}/logback.xml"
  local -a opts
  mapfile -t opts < <(common_jvm_opts admin)
  # C1 only: mqadmin is short-lived, this starts noticeably faster.
  "${JAVA}" -Xms64m -Xmx256m -XX:TieredStopAtLevel=1 "${opts[@]}" -cp "$(classpath)" "${ADMIN_MAIN}" "$@"
}

cmd_admin() {
  [[ $# -gt 0 ]] || die "usage: $0 admin SUBCOMMAND [ARGS...]"
  run_admin "$@"
}

cmd_topic() {
  [[ $# -ge 1 && $# -le 2 ]] || die "usage: $0 topic NAME [QUEUES]"
  local topic="$1" queues="${2:-4}"
  [[ "${queues}" =~ ^[1-9][0-9]*$ ]] || die "QUEUES must be a positive integer, got '${queues}'"
  alive_pid broker >/dev/null || die "broker is not running; run '$0 up' first"
  local out
  out="$(run_admin updateTopic -n "${NAMESRV_ADDR}" -c "${CLUSTER_NAME}" -t "${topic}" -r "${queues}" -w "${queues}" 2>&1)" || true
  if [[ "${out}" != *"success"* ]]; then
    printf '%s\n' "${out}" >&2
    die "creating topic ${topic} failed"
  fi
  log "topic ${topic} created/updated with ${queues} queues"
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}

main() {
  [[ $# -ge 1 ]] || usage
  local cmd="$1"
  shift
  case "${cmd}" in
    up | down | kill | start) lock_state ;;
  esac
  case "${cmd}" in
    up) cmd_up ;;
    down) cmd_down ;;
    env) cmd_env ;;
    topic) cmd_topic "$@" ;;
    admin) cmd_admin "$@" ;;
    kill) cmd_kill ;;
    start) cmd_start ;;
    status) cmd_status ;;
    -h | --help | help) usage ;;
    *) log "unknown command: ${cmd}"; usage ;;
  esac
}

main "$@"
