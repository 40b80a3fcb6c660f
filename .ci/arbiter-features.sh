#!/usr/bin/env bash
# leasefence-arbiter's cargo features: the crate builds (lints clean, every
# target) with no feature and with each feature alone, and one backend does not
# drag another backend's client library into the dependency tree.
set -euo pipefail
cd "$(dirname "$0")/.."

crate=leasefence-arbiter
# Every feature of the crate, each checked alone.
features=(postgres sqlite redis embedded http grpc nats amqp gateway)
# Each backend and the crates that only it may bring.
declare -A backend_crates=(
  [postgres]="tokio-postgres deadpool-postgres"
  [sqlite]="rusqlite libsqlite3-sys"
  [redis]="redis"
  [embedded]="redb"
  [nats]="async-nats"
  [amqp]="lapin"
)
# Features built on a backend, which may bring its crates.
declare -A builds_on=(
  [gateway]="embedded"
)

# `cargo clippy -D warnings` is `cargo check` that also fails on warnings:
# an unused import under one feature set is a broken feature gate.
check() {
  echo "== cargo clippy -p $crate --no-default-features $* --all-targets"
  cargo clippy -q -p "$crate" --no-default-features "$@" --all-targets -- -D warnings
}

# Fails naming the crate when the normal dependency tree of `$crate` built
# with `$1` (a feature, or "" for none) contains a crate of another backend.
no_leak() {
  local feature="$1" args=(--no-default-features) tree name leaked=0
  [ -n "$feature" ] && args+=(--features "$feature")
  tree="$(cargo tree -q -p "$crate" "${args[@]}" -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u)"
  for backend in "${!backend_crates[@]}"; do
    [ "$backend" = "$feature" ] && continue
    [ -n "$feature" ] && [[ " ${builds_on[$feature]:-} " == *" $backend "* ]] && continue
    for name in ${backend_crates[$backend]}; do
      if grep -qx "$name" <<<"$tree"; then
        echo "FAIL: $crate ${args[*]} has $name (backend $backend) in its dependency tree" >&2
        cargo tree -q -p "$crate" "${args[@]}" -e normal -i "$name" >&2 || true
        leaked=1
      fi
    done
  done
  return "$leaked"
}

echo "== cargo build -p $crate --no-default-features --features postgres"
cargo build -q -p "$crate" --no-default-features --features postgres

check
no_leak ""
for f in "${features[@]}"; do
  check --features "$f"
  no_leak "$f"
done
# The schemes of the backends left out must name the feature to enable.
echo "== cargo test -p $crate --no-default-features --lib"
cargo test -q -p "$crate" --no-default-features --lib
echo "arbiter features: OK (${features[*]}, and none)"
