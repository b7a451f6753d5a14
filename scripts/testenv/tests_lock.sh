# Sourced by the service scripts (after log and die are defined).
#
# wait_tests_done SERVICE waits while a test holds SERVICE exclusively
# (testenv.KafkaExclusive, MySQLExclusive, RedisExclusive: it may have
# killed, paused or restarted the service on purpose and will bring it back
# itself). Without it, an `up` from another checkout's `make test` at that
# moment found the service down and started a fresh one — for Kafka on a new
# data dir, wiping the test's topics. The lock is the tests' own flock
# (internal/testenv); it is held shared on fd 8 until the script exits, so
# a service the script launches must not inherit fd 8 (`8>&-`): a server
# holding it would keep every exclusive test out for as long as it runs.
# Take it before the script's own lock, which the test's `start` needs.
wait_tests_done() {
  exec 8>"${TMPDIR:-/tmp}/idem-$1-tests.lock"
  if ! flock -s -n 8; then
    log "a test holds $1 exclusively; waiting for it to end"
    flock -s -w 900 8 || die "a test held $1 exclusively for 15 minutes"
  fi
}
