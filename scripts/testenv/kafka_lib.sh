# Sourced by kafka.sh and kafka-cluster.sh: the Kafka jars and one KRaft
# node's life (config, format, start, readiness, stop). Needs log, die and
# service_lib.sh.
#
# The node functions work on these variables, which the caller sets (for
# kafka-cluster.sh, once per node): STATE, HOST, PORT, CONTROLLER_PORT,
# HEAP (an array of -Xms/-Xmx) and SED_ARGS (extra sed expressions for the
# config, an array, may be empty); node_files then sets DATA, LOGS, CONF,
# LOG4J, OUT and PIDFILE, the node's files under STATE.

KAFKA_VERSION="${IDEM_KAFKA_VERSION:-4.1.1}"
READY_LINE='Kafka Server started'
READY_TIMEOUT=${READY_TIMEOUT:-120}
STOP_TIMEOUT=30

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SRC="$ROOT/testdata/brokers/kafka"
CACHE="${IDEM_CACHE_DIR:-$HOME/.cache/idem}/kafka-$KAFKA_VERSION"
LIBS="$CACHE/libs"
STAMP="$CACHE/libs.stamp"

JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
JVM_OPTS=(
  -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
  -XX:+ExplicitGCInvokesConcurrent
  -XX:TieredStopAtLevel=1
  -Djava.awt.headless=true
)

# node_files: the node's files under STATE (see above).
node_files() {
  DATA="$STATE/data"
  LOGS="$STATE/logs"
  CONF="$STATE/server.properties"
  LOG4J="$STATE/log4j2.properties"
  OUT="$STATE/kafka.out"
  PIDFILE="$STATE/kafka.pid"
}

# --- jars -----------------------------------------------------------------

stamp_value() {
  printf '%s %s\n' "$KAFKA_VERSION" "$(sha256sum "$SRC/pom.xml" | cut -d' ' -f1)"
}

ensure_libs() {
  if [[ -f "$STAMP" && -d "$LIBS" && "$(cat "$STAMP")" == "$(stamp_value)" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (needed to download Kafka $KAFKA_VERSION jars)"
  # Two scripts may download at once (kafka and kafka-cluster in one `up`
  # of another checkout): one does, the other waits and finds the stamp.
  mkdir -p "$CACHE"
  exec 7>"$CACHE/.download.lock"
  flock 7
  if [[ -f "$STAMP" && -d "$LIBS" && "$(cat "$STAMP")" == "$(stamp_value)" ]]; then
    exec 7>&-
    return 0
  fi
  log "downloading Kafka $KAFKA_VERSION jars into $LIBS"
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
  exec 7>&-
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

# render_config [OVERRIDES]: the node's config is server.properties with
# the data dir filled in, followed by OVERRIDES (a file of the same form,
# rendered alike: a later key wins).
render_config() {
  mkdir -p "$STATE" "$LOGS"
  sed -e "s#@DATA_DIR@#$DATA#g" ${SED_ARGS[@]+"${SED_ARGS[@]}"} "$SRC/server.properties" ${1:+"$1"} >"$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
  cp "$SRC/log4j2.properties" "$LOG4J"
}

# config_digest: a digest of the settings (comments and blank lines left
# out) of the config on stdin.
config_digest() {
  grep -Ev '^[[:space:]]*(#|$)' | sha256sum | cut -d' ' -f1
}

# config_changed [OVERRIDES]: whether the node's config as render_config
# would write it now has other settings than the one its data dir was
# formatted with (recorded by format_storage in $DATA.config; `start` on an
# existing data dir keeps the record). A node's data made under an older
# server.properties keeps its old settings (an internal topic's are fixed
# when it is created), so `up` starts such a node afresh — when no test is
# using it (restart_if_unused).
config_changed() {
  [[ -f "$DATA.config" ]] || return 0
  [[ "$(sed -e "s#@DATA_DIR@#$DATA#g" ${SED_ARGS[@]+"${SED_ARGS[@]}"} "$SRC/server.properties" ${1:+"$1"} | config_digest)" != "$(cat "$DATA.config")" ]]
}

# unused_by_tests: whether no test holds the service (the tests' lock on fd
# 8, taken shared by wait_tests_done, can be had exclusively). On success
# the lock is held exclusively until the script exits, so no test starts
# on the service while `up` restarts it.
unused_by_tests() {
  flock -x -n 8
}

java_common() {
  printf '%s\n' "${HEAP[@]}" "${JVM_OPTS[@]}" \
    "-Dlog4j2.configurationFile=$LOG4J" "-Dkafka.logs.dir=$LOGS" \
    -cp "$LIBS/*"
}

# format_storage CLUSTER_ID: a fresh data dir (what was in DATA is
# removed), formatted for the cluster.
format_storage() {
  rm -rf "$DATA"
  mkdir -p "$DATA"
  log "formatting $DATA (cluster id $1)"
  local opts
  mapfile -t opts < <(java_common)
  "$JAVA" "${opts[@]}" kafka.tools.StorageTool format \
    -t "$1" -c "$CONF" --ignore-formatted >&2 \
    || die "storage format failed"
  config_digest <"$CONF" >"$DATA.config"
}

# spawn: start the broker in the background on the current data dir and
# write its pid file; wait_ready waits for it.
spawn() {
  ports_free
  local opts pid
  mapfile -t opts < <(java_common)
  [[ -f "$OUT" ]] && mv -f "$OUT" "$OUT.prev"
  log "starting Kafka $KAFKA_VERSION on $HOST:$PORT (log: $OUT)"
  # setsid+nohup: survive the calling shell; fds 7-9 (our locks) must not leak.
  setsid nohup "$JAVA" "${opts[@]}" kafka.Kafka "$CONF" \
    >"$OUT" 2>&1 </dev/null 7>&- 8>&- 9>&- &
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
}

# launch: spawn and wait for readiness; kill it again if it does not
# become ready.
launch() {
  local start=$SECONDS pid
  spawn
  pid=$(cat "$PIDFILE")
  if ! wait_ready "$pid"; then
    stop_pid "$pid" KILL
    rm -f "$PIDFILE"
    die "Kafka did not start"
  fi
  log "Kafka ready on $HOST:$PORT (pid $pid) after $((SECONDS - start)) s"
}
