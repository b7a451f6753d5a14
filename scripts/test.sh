#!/usr/bin/env bash
# What `make test` runs, in two phases, so that the clusters' five JVMs
# never run beside the rest of the suite (on two cores, the load of the
# fault suite's own child processes, compiles and the other packages was
# what broke RocketMQ brokers' restarts and scenarios;
# docs/records/reliability-runs.md):
#
#   1. every package under -race against the single services (Postgres,
#      Kafka, RocketMQ, MariaDB, Redis), the cluster scenarios left out;
#   2. for each cluster in SERVICES (kafka-cluster, rocketmq-cluster), one
#      at a time: start it, run its scenarios of internal/testenv/faults that
#      make test runs (CLUSTER_RUN_<cluster>), stop it.
#
# Then each package's time and a count. Environment: SERVICES, PKGS and
# SKIP as the Makefile passes them; GOFLAGS as usual.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

read -r -a services <<<"${SERVICES:-postgres kafka rocketmq mariadb redis chromium kafka-cluster rocketmq-cluster}"
read -r -a pkgs <<<"${PKGS:-./...}"
singles=() clusters=()
for s in "${services[@]}"; do
  case "$s" in
    kafka-cluster | rocketmq-cluster) clusters+=("$s") ;;
    *) singles+=("$s") ;;
  esac
done
# The scenarios each cluster runs in make test: the lighter of each (the
# leader of the busiest partitions killed and brought back, about 45 s; a
# RocketMQ master lost for 35 s and brought back, about 80 s). make
# test-faults runs them all.
declare -A cluster_run=(
  [kafka-cluster]='TestFaults/^kafka-cluster$/^leader-sigkill$'
  [rocketmq-cluster]='TestFaults/^rocketmq-cluster$/^broker-lost-and-back$'
)

# internal/testenv/faults is a module of its own (toxiproxy and zerolog stay
# out of the library's go.mod), run from its directory: a PKGS of ./..., of a
# pattern that covers it (./internal/...) or naming it runs it. It runs after
# the root module's packages, no longer beside them in one of go test's -p
# slots: less load at once, a longer make test.
faults=internal/testenv/faults run_faults=false root_pkgs=()
for p in "${pkgs[@]}"; do
  d=${p#./} d=${d%/}
  case "$d" in
    "${faults}" | "${faults}/...") run_faults=true ;;
    ... | */...)
      [[ "${faults}/" == "${d%...}"* ]] && run_faults=true
      root_pkgs+=("$p")
      ;;
    *) root_pkgs+=("$p") ;;
  esac
done

start=${SECONDS}
# A failed fault scenario keeps each child's whole log and goroutine dump
# here (the test output shows only their last 4 KiB): the evidence of a
# failure that does not come back when run again.
export IDEM_FAULTS_KEEP="${IDEM_FAULTS_KEEP:-${IDEM_TESTENV_DIR:-/tmp/idem-testenv}/faults-keep/$(date -u +%Y%m%dT%H%M%S)}"
mkdir -p "${IDEM_FAULTS_KEEP}"
log=$(mktemp)
trap 'rm -f "${log}"' EXIT
eval "$(scripts/testenv.sh up "${singles[@]}")"
echo "test environment up in $((SECONDS - start)) s"

rc=0
skip="TestFaults/(kafka-cluster|rocketmq-cluster)${SKIP:+|${SKIP}}"
if (( ${#root_pkgs[@]} > 0 )); then
  go test -race -count=1 -timeout 20m -skip "${skip}" "${root_pkgs[@]}" 2>&1 | tee -a "${log}" || rc=1
fi
if ${run_faults}; then
  go test -C "${faults}" -race -count=1 -timeout 20m -skip "${skip}" . 2>&1 | tee -a "${log}" || rc=1
fi
# deploy/ is a module of its own, so that Prometheus' server module (its
# PromQL parser) stays out of the library's go.mod; ./... runs it too. So
# is internal/apicheck (apidiff, go/packages).
if printf '%s\n' "${pkgs[@]}" | grep -qx '\./\.\.\.'; then
  go test -C deploy -race -count=1 -timeout 20m ./... 2>&1 | tee -a "${log}" || rc=1
  go test -C internal/apicheck -race -count=1 -timeout 5m ./... 2>&1 | tee -a "${log}" || rc=1
fi

# The clusters' scenarios live in internal/testenv/faults; a PKGS without it runs none.
if ${run_faults}; then
  for c in "${clusters[@]}"; do
    began=${SECONDS}
    eval "$(scripts/testenv.sh up "$c")"
    echo "${c} up in $((SECONDS - began)) s"
    go test -C "${faults}" -race -count=1 -timeout 20m -run "${cluster_run[$c]}" . 2>&1 \
      | sed -E "s#^(ok|FAIL)([[:space:]]+github.com/idemkit/idem/internal/testenv/faults)([[:space:]])#\1\2@${c}\3#" \
      | tee -a "${log}" || rc=1
    scripts/testenv.sh down "$c"
  done
fi

echo
echo "package times, slowest first:"
awk '$1 == "ok" || ($1 == "FAIL" && NF >= 2) {printf "  %8s  %-4s %s\n", $3, $1, $2}' "${log}" | sort -k1,1 -rn
echo "make test took $((SECONDS - start)) s"
awk '$1 == "ok" {ok++} $1 == "FAIL" && NF >= 2 {bad++} END {printf "packages: %d passed, %d failed\n", ok, bad}' "${log}"
if (( rc != 0 )) && [[ -n "$(ls -A "${IDEM_FAULTS_KEEP}")" ]]; then
  echo "failed fault scenarios' child logs: ${IDEM_FAULTS_KEEP}"
fi
exit "${rc}"
