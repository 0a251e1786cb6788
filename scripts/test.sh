#!/usr/bin/env bash
# Runs the whole test suite against real servers on a fresh machine.
#
# The tests start their own redis-server, redis-sentinel, valkey-server, etcd, PostgreSQL,
# PgBouncer, MariaDB and ZooKeeper processes (own ports, own temp dirs) and stop them by PID; they never use
# a server that happens to be running. scripts/deps.sh installs what is missing first (see there).
#
# With no arguments, every test target runs, in two lanes side by side once everything is
# built: the slowest targets (the fairness matrices, the conformance suite, the failover
# comparison, etcd's faults) in one, the rest and the doc tests in the other; then the tests
# whose timing a busy machine shifts, alone. No two tests share a port or a directory, and most
# of their time is spent waiting on servers, not on the CPUs.
# With arguments, `cargo test` runs with them as given (one target:
# `./scripts/test.sh -p distlock-tests --test postgres`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

# The CLI's etcd, postgres, mysql and zookeeper features too (the runtime's are on for the test
# crate already).
cargo_test=(cargo test --workspace --locked --features distlock-cli/etcd,distlock-cli/postgres,distlock-cli/mysql,distlock-cli/zookeeper)
if [ "$#" -gt 0 ]; then
  exec "${cargo_test[@]}" "$@"
fi

slow=(fairness conformance failover etcd)
# The model checker runs on its own, optimised (the `model` profile), before the lanes: it
# keeps both CPUs busy for a minute or two.
model=(cargo test --profile model -p distlock-model --locked --no-fail-fast -- --nocapture)
# Run last, with the CPUs to themselves: the scale test's ten thousand waiters keep both CPUs
# busy and count every heap byte; the cancellation test aims at phases it times first, and safety's two processes must each find
# the lock busy: timings the lanes beside them would shift.
alone=(scale cancellation safety)
"${cargo_test[@]}" --no-run
# Every target runs even after one fails, so that a run reports every failure.
cargo_test+=(--no-fail-fast)
# Every other test target of the workspace, by name.
rest=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys
slow = set(sys.argv[1:])
names = {t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"]
         if "test" in t["kind"] and t["name"] not in slow}
print(" ".join("--test " + name for name in sorted(names)))
' "${slow[@]}" "${alone[@]}" model)

status=0
"${model[@]}" || status=$?

slow_log=$(mktemp)
"${cargo_test[@]}" $(printf -- '--test %s ' "${slow[@]}") >"$slow_log" 2>&1 &
slow_lane=$!
# shellcheck disable=SC2086 # one word per flag and name
"${cargo_test[@]}" --lib --bins --examples $rest || status=$?
"${cargo_test[@]}" --doc || status=$?
wait "$slow_lane" || status=$?
echo "--- the slow lane: ${slow[*]}"
cat "$slow_log"
rm -f "$slow_log"
"${cargo_test[@]}" $(printf -- '--test %s ' "${alone[@]}") || status=$?
exit "$status"
