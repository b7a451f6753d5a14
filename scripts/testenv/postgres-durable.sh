#!/usr/bin/env bash
# A second Postgres cluster for benchmarks: port 5433, fsync and synchronous_commit
# on. Same subcommands as postgres.sh; `env` prints IDEM_BENCH_PG_URL.
# IDEM_PG_SHARED_BUFFERS=6GB runs it with that shared_buffers (restarting it
# when the setting changes); unset, with the default.
IDEM_PG_DURABLE=1 exec "$(dirname "${BASH_SOURCE[0]}")/postgres.sh" "$@"
