#!/usr/bin/env bash
# A private single-node Kafka (KRaft, broker+controller) for a test that
# restarts its broker (make soak): its own ports and data dir, so that its
# restarts never disturb the shared broker of kafka.sh. Same jars and node
# helpers as kafka.sh (kafka_lib.sh). testenv.NewPrivateKafka drives it.
#
# Usage: scripts/testenv/kafka-private.sh up|start|kill|down DIR [PORT CONTROLLER_PORT]
#   up DIR PORT CONTROLLER_PORT
#          format a fresh data dir under DIR and start the broker on
#          127.0.0.1:PORT (controller on CONTROLLER_PORT); the ports are
#          kept in DIR/ports for the other commands
#   start  start the broker again on its data dir (after kill or down)
#   kill   kill -9 the broker (a crash); the data dir is kept
#   down   stop the broker (SIGTERM, up to 30 s, then SIGKILL)
#
# Environment: IDEM_CACHE_DIR, IDEM_KAFKA_VERSION as for kafka.sh. Progress
# messages go to stderr.
set -euo pipefail

log() { printf 'kafka-private.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ $# -ge 2 ]] || die "usage: $0 up|start|kill|down DIR [PORT CONTROLLER_PORT]"
CMD=$1
STATE=$2
HOST=127.0.0.1
CLUSTER_ID=pVt1a0XzRnKQ8u4cM2xKzw
if [[ "$CMD" == up ]]; then
  [[ $# -eq 4 ]] || die "up needs DIR PORT CONTROLLER_PORT"
  mkdir -p "$STATE"
  echo "$3 $4" >"$STATE/ports"
fi
[[ -f "$STATE/ports" ]] || die "no broker was set up in $STATE (run up first)"
read -r PORT CONTROLLER_PORT <"$STATE/ports"
HEAP=(-Xms128m -Xmx384m)
# server.properties is kafka.sh's node on 9092/9093: move it to our ports.
SED_ARGS=(-e "s#$HOST:9093#$HOST:$CONTROLLER_PORT#g" -e "s#$HOST:9092#$HOST:$PORT#g")

# shellcheck source=service_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/service_lib.sh"
# shellcheck source=kafka_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/kafka_lib.sh"
node_files

lock
case "$CMD" in
  up)
    if find_pid >/dev/null; then die "a broker already runs on $STATE"; fi
    ensure_libs
    render_config
    format_storage "$CLUSTER_ID"
    launch
    ;;
  start)
    if pid="$(find_pid)"; then
      wait_ready "$pid" || die "Kafka did not become ready"
      exit 0
    fi
    launch
    ;;
  kill)
    if pid="$(find_pid)"; then
      log "killing Kafka (pid $pid) with SIGKILL"
      stop_pid "$pid" KILL
    fi
    rm -f "$PIDFILE"
    ;;
  down)
    if pid="$(find_pid)"; then
      log "stopping Kafka (pid $pid)"
      stop_pid "$pid" TERM
    fi
    rm -f "$PIDFILE"
    ;;
  *) die "unknown command $CMD" ;;
esac
