#!/usr/bin/env bash
# Runs the whole test suite against real Redis on a fresh machine.
#
# The tests start their own redis-server processes (own ports, own temp dirs) and stop them by
# PID; they never use a server that happens to be running. This script only makes sure the
# redis-server binary exists, installing it with apt-get when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found; installing it with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version

cargo test --workspace --locked "$@"
