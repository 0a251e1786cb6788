#!/usr/bin/env bash
# Runs the whole test suite against real Redis on a fresh machine.
#
# The tests start their own redis-server processes (own ports, own temp dirs) and stop them by
# PID; they never use a server that happens to be running. This script only makes sure the
# binaries they run exist, installing the missing ones with apt-get: redis-server (which is also
# the sentinel: the Sentinel tests run `redis-server <conf> --sentinel`), redis-cli (the cluster
# tests create their clusters with `redis-cli --cluster create`), and openssl (the TLS tests make
# their certificates with it).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
redis-server --version
redis-cli --version
openssl version

cargo test --workspace --locked "$@"
