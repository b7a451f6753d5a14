#!/usr/bin/env bash
# Chromium from Debian's packages, for the browser test of `idem console`
# (cmd/idem's TestConsoleInTheBrowser drives it headless through chromedp).
# Nothing runs in the background: the test starts and stops its own browser.
#
#   chromium.sh up     install chromium when missing
#   chromium.sh down   nothing (the test's browser exits with the test)
#   chromium.sh env    print IDEM_TEST_CHROMIUM
#
# Progress goes to stderr; only `env` writes to stdout.
set -euo pipefail
BIN=${IDEM_CHROMIUM_BIN:-/usr/bin/chromium}
log() { echo "chromium.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

up() {
  if [ -x "$BIN" ]; then
    log "ready: $BIN ($("$BIN" --version 2>/dev/null || echo 'version unknown'))"
    return 0
  fi
  [ "$(id -u)" = 0 ] || die "chromium is not installed and this is not root"
  log "installing chromium from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
  [ -x "$BIN" ] || die "$BIN not found after installing chromium"
  log "ready: $BIN"
}

case "${1:-}" in
  up) up ;;
  down) ;;
  env) echo "export IDEM_TEST_CHROMIUM=$BIN" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
