#!/usr/bin/env bash
# The test command (README): works on a fresh machine by itself.
# Installs redis-server when missing (the Redis tests use a real one), then
# runs go vet and the whole suite with the race detector.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "test.sh: installing redis-server" >&2
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

echo "test.sh: go vet ./..." >&2
go vet ./...
echo "test.sh: go test -race ./..." >&2
# -p 1: one package at a time. The end-to-end packages assert timing bounds
# (rates, windows); run side by side on 2 cores they disturb each other.
go test -race -count=1 -p 1 -timeout 15m "$@" ./...
