#!/usr/bin/env bash
# Run test packages again and again, under -race and optionally under extra
# CPU load, and count the failures per test. A flaky test shows here before it
# blocks someone's landing; a fix is proven by a clean series.
#
#   scripts/stress.sh [-n RUNS] [-load BUSY_LOOPS] [-run REGEX] [-services "postgres kafka"] PKG...
#
#   -n         how many runs (default 10)
#   -load      busy loops kept spinning while the tests run, one core each (default 0)
#   -run       go test -run pattern (default: every test)
#   -services  the test environment to start first (default: postgres kafka rocketmq)
#   -timeout   per run (default 20m)
#
# Each package's test binary is built once (-race) and run RUNS times in its
# own directory, as go test would. Logs of failed runs are kept under
# $IDEM_STRESS_DIR (default /tmp/idem-stress). Exits 1 when any run failed.
#
#   scripts/stress.sh -n 20 -load 1 ./dedup/pgstore/ ./consumer/...
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

runs=10 load=0 run="" timeout=20m services="postgres kafka rocketmq"
while [ $# -gt 0 ]; do
  case "$1" in
    -n) runs=$2; shift 2 ;;
    -load) load=$2; shift 2 ;;
    -run) run=$2; shift 2 ;;
    -services) services=$2; shift 2 ;;
    -timeout) timeout=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "stress.sh: unknown flag $1 (see -h)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "stress.sh: name the packages to run (see -h)" >&2; exit 2; }
[[ "$runs" =~ ^[0-9]+$ && "$load" =~ ^[0-9]+$ ]] || { echo "stress.sh: -n and -load take whole numbers" >&2; exit 2; }

if [ -n "$services" ]; then
  # shellcheck disable=SC2086
  out=$(scripts/testenv.sh up $services)
  eval "$out"
fi

dir=${IDEM_STRESS_DIR:-/tmp/idem-stress}
mkdir -p "$dir"
bins=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$bins"
}
trap cleanup EXIT

# One binary per package with tests. A directory is listed from itself, so
# that a package of a nested module (internal/testenv/faults, deploy) is
# listed and built in its own module; an import path from the root.
format='{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Module.Dir}} {{.Dir}}{{end}}'
pkgs=()
for a in "$@"; do
  d=${a%/...} pat=.
  if [ "$d" != "$a" ]; then pat=./...; fi
  d=${d%/}
  if [ -d "$d" ]; then
    mapfile -t -O "${#pkgs[@]}" pkgs < <(go list -C "$d" -f "$format" "$pat")
  else
    mapfile -t -O "${#pkgs[@]}" pkgs < <(go list -f "$format" "$a")
  fi
done
[ ${#pkgs[@]} -gt 0 ] || { echo "stress.sh: no test files in $*" >&2; exit 2; }
for p in "${pkgs[@]}"; do
  read -r ip mdir _ <<<"$p"
  go test -C "$mdir" -race -c -o "$bins/$(echo "$ip" | tr '/' '_').test" "$ip"
done

for ((i = 0; i < load; i++)); do
  (while :; do :; done) &
  pids+=($!)
done
[ "$load" -gt 0 ] && echo "stress.sh: $load busy loop(s) running" >&2

declare -A fails=()
failed_runs=0
for ((r = 1; r <= runs; r++)); do
  ok=1 start=$SECONDS
  for p in "${pkgs[@]}"; do
    read -r ip _ pdir <<<"$p"
    bin="$bins/$(echo "$ip" | tr '/' '_').test"
    log="$dir/run$r-$(echo "$ip" | tr '/' '_').log"
    args=(-test.count=1 -test.v -test.timeout "$timeout")
    [ -n "$run" ] && args+=(-test.run "$run")
    if (cd "$pdir" && "$bin" "${args[@]}") >"$log" 2>&1; then
      rm -f "$log"
    else
      ok=0
      # The innermost failing tests, not their parents.
      while read -r t; do
        fails[$t]=$((${fails[$t]:-0} + 1))
      done < <(grep -oE -- '--- FAIL: [^ ]+' "$log" | awk '{print $3}' | sort -u |
        awk '{a[NR]=$0} END {for (i=1;i<=NR;i++) {leaf=1; for (j=1;j<=NR;j++) if (index(a[j], a[i] "/")==1) leaf=0; if (leaf) print a[i]}}')
      grep -q -- '--- FAIL' "$log" || fails["$ip (no test named: panic, timeout or build)"]=$((${fails["$ip (no test named: panic, timeout or build)"]:-0} + 1))
      echo "run $r: FAIL $ip (log: $log)" >&2
    fi
  done
  [ $ok = 1 ] || failed_runs=$((failed_runs + 1))
  echo "run $r/$runs: $([ $ok = 1 ] && echo ok || echo FAIL) in $((SECONDS - start)) s"
done

echo "stress.sh: $((runs - failed_runs)) of $runs runs passed ($*, load $load)"
for t in "${!fails[@]}"; do
  printf '  %3d/%d  %s\n' "${fails[$t]}" "$runs" "$t"
done | sort -rn
[ $failed_runs = 0 ]
