#!/usr/bin/env bash
# The test command (README): works on a fresh machine by itself.
# Installs what the tests need (below), then runs go vet and the whole suite
# with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs, when missing: redis-server (the Redis tests use a real one) and
# chromium (the console test drives it headless; under CI=true a missing
# browser fails that test). apt-get update runs once, and only if needed.
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
apt_updated=""
apt_install() { # apt_install PACKAGE
  if [ -z "$apt_updated" ]; then
    $SUDO apt-get update -qq
    apt_updated=1
  fi
  echo "test.sh: installing $1" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$1" >/dev/null
}
if ! command -v redis-server >/dev/null 2>&1; then
  apt_install redis-server
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  apt_install chromium
fi

echo "test.sh: go vet ./..." >&2
go vet ./...
echo "test.sh: go test -race ./..." >&2
# -p 1: one package at a time. The end-to-end packages assert timing bounds
# (rates, windows); run side by side on 2 cores they disturb each other.
go test -race -count=1 -p 1 -timeout 15m "$@" ./...
