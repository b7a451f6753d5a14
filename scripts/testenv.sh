#!/usr/bin/env bash
# The test environment: real services on 127.0.0.1, no Docker.
#
#   scripts/testenv.sh up   [service...]   install when missing, start, print the environment
#   scripts/testenv.sh down [service...]   stop
#   scripts/testenv.sh env  [service...]   print the environment (export lines)
#
# Services: postgres, kafka, kafka-cluster, rocketmq, rocketmq-cluster,
# mariadb, redis, chromium (default: $IDEM_TESTENV_SERVICES, else all but the two
# clusters of the failover tests, kafka-cluster (three Kafka nodes) and
# rocketmq-cluster (a name server and two RocketMQ brokers)).
# `eval "$(scripts/testenv.sh up)"` sets IDEM_TEST_PG_URL,
# IDEM_TEST_KAFKA_BROKERS, IDEM_TEST_ROCKETMQ_NAMESRV, IDEM_TEST_MYSQL_DSN and
# IDEM_TEST_REDIS_ADDR, IDEM_TEST_CHROMIUM (kafka-cluster IDEM_TEST_KAFKA_CLUSTER,
# rocketmq-cluster IDEM_TEST_ROCKETMQ_CLUSTER). Running `up` twice is
# harmless. Progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cmd=${1:-}
[ $# -gt 0 ] && shift
if [ $# -gt 0 ]; then
  services=("$@")
else
  read -r -a services <<<"${IDEM_TESTENV_SERVICES:-postgres kafka rocketmq mariadb redis chromium}"
fi
case "$cmd" in
  up)
    for s in "${services[@]}"; do "$here/testenv/$s.sh" up >&2; done
    for s in "${services[@]}"; do "$here/testenv/$s.sh" env; done
    ;;
  down)
    for s in "${services[@]}"; do "$here/testenv/$s.sh" down >&2 || true; done
    ;;
  env)
    for s in "${services[@]}"; do "$here/testenv/$s.sh" env; done
    ;;
  *)
    echo "usage: $0 up|down|env [postgres|kafka|kafka-cluster|rocketmq|rocketmq-cluster|mariadb|redis|chromium ...]" >&2
    exit 2
    ;;
esac
