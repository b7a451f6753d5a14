# Sourced by rocketmq.sh and rocketmq-cluster.sh: the RocketMQ jars and the
# life of one server (name server or broker) of a state dir: config,
# start, readiness, stop, mqadmin. Needs log and die.
#
# The caller sets STATE_DIR, NAMESRV_HOST and NAMESRV_ADDR, and defines,
# for a server NAME (namesrv, broker, broker1, ...):
#   server_kind NAME   namesrv or broker
#   server_home NAME   its user.home and rocketmq.home.dir (RocketMQ hangs
#                      ~/store, ~/namesrv and ~/logs off user.home)
#   server_port NAME   its listen port
#   server_heap NAME   its -Xms/-Xmx/... options, one a line
# Its config is ${CONF_DIR}/NAME.conf, its output ${LOG_DIR}/NAME.out, its
# log ${LOG_DIR}/NAME.log, its pid file ${RUN_DIR}/NAME.pid.

CONF_DIR="${STATE_DIR}/conf"
LOG_DIR="${STATE_DIR}/logs"
RUN_DIR="${STATE_DIR}/run"

ROCKETMQ_VERSION="${IDEM_ROCKETMQ_VERSION:-5.3.3}"
JAVA="${JAVA:-java}"
MVN="${MVN:-mvn}"
# A server is given up on when it wrote nothing to its log or output for
# READY_TIMEOUT seconds, or was not ready after READY_CAP: a broker
# recovering its store after a crash, on a machine the suite itself loads,
# can take minutes, and goes on logging while it does.
READY_TIMEOUT="${IDEM_ROCKETMQ_READY_TIMEOUT:-90}" # seconds of silence, per server
READY_CAP="${IDEM_ROCKETMQ_READY_CAP:-420}"        # seconds in all, per server
STOP_TIMEOUT=30  # seconds, per server

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TEMPLATE_DIR="${REPO_ROOT}/testdata/brokers/rocketmq"

CACHE_DIR="${IDEM_CACHE_DIR:-${HOME}/.cache/idem}/rocketmq-${ROCKETMQ_VERSION}"
LIB_DIR="${CACHE_DIR}/lib"
LIB_STAMP="${CACHE_DIR}/lib.complete"

NAMESRV_MAIN=org.apache.rocketmq.namesrv.NamesrvStartup
BROKER_MAIN=org.apache.rocketmq.broker.BrokerStartup
ADMIN_MAIN=org.apache.rocketmq.tools.command.MQAdminStartup

# Takes the state lock on fd 9 (released when the script exits). Children
# started while holding it must close fd 9 (see launch).
lock_state() {
  mkdir -p "${STATE_DIR}"
  exec 9>>"${STATE_DIR}/.lock"
  if ! flock -n 9; then
    log "waiting for another $(basename "$0") to finish ..."
    flock -w 300 9 || die "timed out waiting for ${STATE_DIR}/.lock"
  fi
}

# ---------------------------------------------------------------- jars

jars_complete() {
  [[ -f "${LIB_STAMP}" ]] && compgen -G "${LIB_DIR}/rocketmq-broker-${ROCKETMQ_VERSION}.jar" >/dev/null
}

ensure_jars() {
  jars_complete && return 0
  command -v "${MVN}" >/dev/null 2>&1 || die "mvn not found (needed once to fetch the RocketMQ jars)"
  # rocketmq.sh and rocketmq-cluster.sh may both download at once (one
  # `up` of both): one does, the other waits and finds the stamp.
  mkdir -p "${CACHE_DIR}"
  exec 7>"${CACHE_DIR}/.download.lock"
  flock 7
  if jars_complete; then
    exec 7>&-
    return 0
  fi
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
  exec 7>&-
  log "downloaded $(find "${LIB_DIR}" -name '*.jar' | wc -l) jars ($(du -sh "${LIB_DIR}" | cut -f1)) in $((SECONDS - start))s"
}

# ---------------------------------------------------------------- java

# Options shared by all JVMs of the state dir ($1 = server or log name,
# $2 = its home). rocketmq.home.dir must be set or RocketMQ refuses to
# start. closeSocketIfTimeout=false: by default a broker closes its
# connection to the name server when a request on it times out (3 s), and
# the name server then forgets every topic of that broker until it
# registers again (up to 30 s), so that consumers starting meanwhile find
# no route; on two busy cores the suite's own load made that happen
# (docs/records/reliability-runs.md, "route info not found").
common_jvm_opts() {
  printf '%s\n' \
    "-Duser.home=$2" \
    "-Drocketmq.home.dir=$2" \
    "-Drmq.logback.configurationFile=${CONF_DIR}/logback.xml" \
    "-Didem.rocketmq.logFile=${LOG_DIR}/$1.log" \
    "-Drocketmq.namesrv.addr=${NAMESRV_ADDR}" \
    "-Djava.net.preferIPv4Stack=true" \
    "-Dfile.encoding=UTF-8" \
    "-Dcom.rocketmq.remoting.client.closeSocketIfTimeout=false" \
    "-XX:+UseG1GC" \
    "-XX:-OmitStackTraceInFastThrow" \
    "-XX:ErrorFile=${LOG_DIR}/hs_err_$1_%p.log"
}

classpath() { printf '%s/*' "${LIB_DIR}"; }

# ---------------------------------------------------------------- processes

pid_file() { printf '%s/%s.pid' "${RUN_DIR}" "$1"; }
conf_file() { printf '%s/%s.conf' "${CONF_DIR}" "$1"; }

main_class_of() {
  case "$(server_kind "$1")" in
    namesrv) echo "${NAMESRV_MAIN}" ;;
    broker) echo "${BROKER_MAIN}" ;;
  esac
}

# True if process $2 is server $1 of THIS state dir (guards against pid reuse
# and against other RocketMQ processes: the single one, the cluster's, other
# users').
is_our_server() { # $1 = server, $2 = pid
  local cmdline
  cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$2/cmdline" || true)"
  [[ "${cmdline}" == *" $(main_class_of "$1") -c $(conf_file "$1") "* \
     && "${cmdline}" == *" -Duser.home=$(server_home "$1") "* ]]
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

# The ports server $1 listens on: a broker also opens listenPort-2 (the
# "fast"/VIP channel) and listenPort+1 (HA).
server_ports() {
  local p
  p="$(server_port "$1")"
  if [[ "$(server_kind "$1")" == broker ]]; then
    echo "${p} $((p - 2)) $((p + 1))"
  else
    echo "${p}"
  fi
}

# render TEMPLATE SERVER HOME [SED_ARGS...]: the server's config from a
# template, @STATE_DIR@ replaced by HOME, then the extra sed expressions.
render() {
  local template="$1" name="$2" home="$3"
  shift 3
  sed -e "s|@STATE_DIR@|${home}|g" "$@" "${TEMPLATE_DIR}/${template}" >"$(conf_file "${name}")"
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
launch() {
  local name="$1" main conf ready port pid registered="" home
  main="$(main_class_of "${name}")"; conf="$(conf_file "${name}")"; port="$(server_port "${name}")"
  home="$(server_home "${name}")"
  case "$(server_kind "${name}")" in
    namesrv)
      ready='The Name Server boot success'
      ;;
    broker)
      ready='boot success'
      # "boot success" is printed BEFORE the broker is known to the name
      # server: in 5.3.3 the registration attempted inside start() finds no
      # "available" name server yet (that list is filled asynchronously) and
      # is skipped, so the first registration is the periodic one ~10 s
      # later. Until then clients get "route info not found" and mqadmin
      # cannot find the cluster, so also wait for that log line.
      registered='Registering current broker to name server completed'
      ;;
  esac
  local p
  for p in $(server_ports "${name}"); do
    if port_in_use "${p}"; then
      log "${NAMESRV_HOST}:${p} is already in use by a process this script did not start (stop it first)"
      return 1
    fi
  done
  local -a heap opts
  mapfile -t heap < <(server_heap "${name}")
  mapfile -t opts < <(common_jvm_opts "${name}" "${home}")
  mkdir -p "${home}"
  local out="${LOG_DIR}/${name}.out" logf="${LOG_DIR}/${name}.log"
  [[ -f "${out}" ]] && mv -f "${out}" "${out}.prev"
  # Only look at log lines written by this launch (the .log is appended to).
  local log_off=0
  [[ -f "${logf}" ]] && log_off="$(stat -c %s "${logf}")"
  log "starting ${name} ..."
  local start=${SECONDS}
  (
    cd "${home}"
    # 7>&- 8>&- 9>&-: the server must not inherit (and keep holding) the
    # download lock, the tests' lock (service_lib.sh) or the state lock.
    exec setsid nohup "${JAVA}" "${heap[@]}" "${opts[@]}" -cp "$(classpath)" "${main}" -c "${conf}" \
      </dev/null >"${out}" 2>&1 7>&- 8>&- 9>&-
  ) &
  pid=$!
  echo "${pid}" >"$(pid_file "${name}")"
  local booted="" last_size=-1 last_growth=${SECONDS}
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
    local size
    size=$(( $(stat -c %s "${out}" 2>/dev/null || echo 0) + $(stat -c %s "${logf}" 2>/dev/null || echo 0) ))
    if (( size != last_size )); then
      last_size=${size} last_growth=${SECONDS}
    fi
    if (( SECONDS - last_growth >= READY_TIMEOUT || SECONDS - start >= READY_CAP )); then
      log "${name} not ready after $((SECONDS - start))s ($((SECONDS - last_growth))s without a log line); its threads follow in ${out}"
      # The JVM prints every thread's stack to its output on SIGQUIT:
      # where it hangs, for the next reader.
      kill -QUIT "${pid}" 2>/dev/null && sleep 2
      dump_logs "${name}"
      printf '\n----- its main thread -----\n' >&2
      awk '/^"main"/ {p = 1} p && /^$/ {exit} p' "${out}" >&2
      return 1
    fi
    sleep 0.3
  done
}

stop_one() { # $1 = server, $2 = signal mode: term|kill
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

# fresh_state SERVER...: before a real `up`, stop the leftovers of a
# half-started or half-dead environment in the order given (brokers before
# the name server), fail if another process holds one of their ports, and
# empty the state dir (all but the lock file).
fresh_state() {
  local s p
  for s in "$@"; do stop_one "${s}" term; done
  for s in "$@"; do
    for p in $(server_ports "${s}"); do
      if port_in_use "${p}"; then
        die "${NAMESRV_HOST}:${p} is already in use by a process this script did not start (stop it first)"
      fi
    done
  done
  find "${STATE_DIR}" -mindepth 1 -maxdepth 1 ! -name .lock -exec rm -rf {} +
}

# start_namesrv: for a `start` on the existing state, the jars, the log
# and run dirs and the name server, started again if it is down.
start_namesrv() {
  ensure_jars
  mkdir -p "${LOG_DIR}" "${RUN_DIR}"
  if ! alive_pid namesrv >/dev/null; then
    launch namesrv || { stop_one namesrv term; exit 1; }
  fi
}

# crash_one SERVER WHAT: kill -9 SERVER (a crash test; its store is kept),
# WHAT being what the log calls it; a no-op if it is not running.
crash_one() {
  if ! alive_pid "$1" >/dev/null; then
    log "$2 is not running"
    return 0
  fi
  stop_one "$1" kill
}

# print_status SERVER...: one line a server, running (with its pid) or
# stopped; fails if one is stopped.
print_status() {
  local s pid rc=0
  for s in "$@"; do
    if pid="$(alive_pid "${s}")"; then
      echo "${s}: running (pid ${pid})"
    else
      echo "${s}: stopped"
      rc=1
    fi
  done
  return "${rc}"
}

# ---------------------------------------------------------------- mqadmin

run_admin() {
  ensure_jars
  mkdir -p "${LOG_DIR}" "${CONF_DIR}"
  [[ -f "${CONF_DIR}/logback.xml" ]] || cp "${TEMPLATE_DIR}/logback.xml" "${CONF_DIR}/logback.xml"
  local -a opts
  mapfile -t opts < <(common_jvm_opts admin "${STATE_DIR}")
  # C1 only: mqadmin is short-lived, this starts noticeably faster.
  "${JAVA}" -Xms64m -Xmx256m -XX:TieredStopAtLevel=1 "${opts[@]}" -cp "$(classpath)" "${ADMIN_MAIN}" "$@"
}

# create_topic CLUSTER TOPIC QUEUES: create/update a topic on every broker
# of CLUSTER.
create_topic() {
  local cluster="$1" topic="$2" queues="$3"
  [[ "${queues}" =~ ^[1-9][0-9]*$ ]] || die "QUEUES must be a positive integer, got '${queues}'"
  local out
  out="$(run_admin updateTopic -n "${NAMESRV_ADDR}" -c "${cluster}" -t "${topic}" -r "${queues}" -w "${queues}" 2>&1)" || true
  if [[ "${out}" != *"success"* ]]; then
    printf '%s\n' "${out}" >&2
    die "creating topic ${topic} failed"
  fi
  log "topic ${topic} created/updated with ${queues} queues"
}

# rocketmq_command COMMAND [ARGS...]: run the script's COMMAND (its
# cmd_COMMAND: up, down, env, topic, admin, kill, start or status) with
# ARGS, under the state lock for up, down, kill and start.
rocketmq_command() {
  [[ $# -ge 1 ]] || usage
  local cmd="$1"
  shift
  case "${cmd}" in
    up | down | kill | start) lock_state ;;
  esac
  case "${cmd}" in
    up | down | env | topic | admin | kill | start | status) "cmd_${cmd}" "$@" ;;
    -h | --help | help) usage ;;
    *) log "unknown command: ${cmd}"; usage ;;
  esac
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
  exit 2
}
