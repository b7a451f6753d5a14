#!/usr/bin/env bash
# Measures idem on durable Postgres at 1, 2, 4 and 8 lanes (batch 100) and
# one lane at batch 10, one cmd/idem-bench run each, into
# testdata/scaling/*.json: the points internal/capacity fits docs/scaling.md's
# model to. Run it on an otherwise idle machine.
#
#   scripts/scaling.sh            # then: go run ./cmd/idem-capacity
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
eval "$(scripts/testenv.sh up kafka postgres-durable)"
out=testdata/scaling
mkdir -p "$out"
go build -C cmd/idem-bench -o "${TMPDIR:-/tmp}/idem-bench" . # a module of its own
bench="${TMPDIR:-/tmp}/idem-bench"
for lanes in 1 2 4 8; do
  echo "lanes $lanes, batch 100" >&2
  "$bench" -json -rows idem-b100 -partitions "$lanes" -messages "${MESSAGES:-100000}" >"$out/lanes-$lanes.json"
done
echo "lanes 1, batch 10" >&2
"$bench" -json -rows p1-idem -p1-batch 10 -p1-messages 20000 >"$out/lanes-1-batch-10.json"
uptime >&2
