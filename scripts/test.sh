#!/usr/bin/env bash
# Runs the whole test suite against real servers on a fresh machine.
#
# The tests start their own redis-server, redis-sentinel, valkey-server and etcd processes (own
# ports, own temp dirs) and stop them by PID; they never use a server that happens to be
# running. scripts/deps.sh installs what is missing first (see there).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

# The CLI's etcd feature too (the runtime's is on for the test crate already).
cargo test --workspace --locked --features distlock-cli/etcd "$@"
