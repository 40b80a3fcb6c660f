#!/usr/bin/env bash
# Throwaway etcd for the tests of the etcd store: one single-member cluster and
# one 3-member cluster, on free loopback ports (client and peer), in a scratch
# directory. Installs Debian's etcd-server, etcd-client (etcdctl) and
# protobuf-compiler (the etcd client crate compiles etcd's protos) when missing.
#
# Two ways to use it:
#   . .ci/etcd.sh            from .ci/run (sourced): members live under
#                            "$scratch/etcd"; the variables below are exported,
#                            and .ci/run's exit trap calls `etcd_stop`.
#   bash .ci/etcd.sh DIR     by hand: starts the members under DIR, leaves them
#                            running and writes DIR/env (source it to get the
#                            variables); `bash .ci/etcd.sh --stop DIR` stops them.
#
# Exported:
#   LEASEFENCE_TEST_ETCD_URL            etcd://127.0.0.1:PORT (the single member)
#   LEASEFENCE_TEST_ETCD_CLUSTER_URLS   etcd://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3
#   LEASEFENCE_TEST_ETCD_CLUSTER_DIR    the cluster's directory, for failover tests
#
# The cluster's directory, so a test can SIGKILL a member and bring it back:
#   members                    the member names, one a line, in the order of
#                              LEASEFENCE_TEST_ETCD_CLUSTER_URLS (m1, m2, m3)
#   <name>/client              that member's client address, host:port
#   <name>/pid                 the pid of its running etcd (rewritten by `start`)
#   <name>/start               `sh <name>/start` starts it again in the background
#                              with the exact command line it first ran with, on
#                              its data dir (<name>/data), and returns at once
#   <name>/log                 its log, appended to across restarts
# A killed member restarted this way rejoins with its data: the same name, ports
# and data dir. Nothing listens on etcd's standard ports (2379/2380).

# N distinct free loopback ports (all held open while they are picked).
etcd_free_ports() {
  python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

etcd_install() {
  local missing=()
  command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
  command -v etcdctl >/dev/null 2>&1 || missing+=(etcd-client)
  command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing ${missing[*]}"
  # The package's own service would take the standard ports: keep it from
  # starting while it installs (policy-rc.d is honoured by invoke-rc.d and
  # deb-systemd-invoke), and make sure it is stopped and disabled after.
  local policy=/usr/sbin/policy-rc.d placed=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && placed=1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  [ -n "$placed" ] && rm -f "$policy"
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl disable --now etcd >/dev/null 2>&1 || true
  fi
}

# Starts one member: etcd_member DIR NAME CLIENT_PORT PEER_PORT INITIAL_CLUSTER TOKEN
etcd_member() {
  local dir=$1 name=$2 client=$3 peer=$4 initial=$5 token=$6
  local m="$dir/$name"
  mkdir -p "$m/data"
  echo "127.0.0.1:$client" >"$m/client"
  # The exact command, kept so a test can start the member again after a kill.
  cat >"$m/start" <<EOF
#!/bin/sh
cd '$m' || exit 1
nohup etcd --name '$name' --data-dir '$m/data' \\
  --listen-client-urls http://127.0.0.1:$client --advertise-client-urls http://127.0.0.1:$client \\
  --listen-peer-urls http://127.0.0.1:$peer --initial-advertise-peer-urls http://127.0.0.1:$peer \\
  --initial-cluster '$initial' --initial-cluster-token '$token' --initial-cluster-state new \\
  --logger zap --log-outputs stderr </dev/null >>'$m/log' 2>&1 &
echo \$! >'$m/pid'
EOF
  chmod +x "$m/start"
  sh "$m/start"
}

# Waits until every endpoint of a cluster answers as healthy: etcd_healthy NAME ENDPOINTS
etcd_healthy() {
  local what=$1 endpoints=$2
  for _ in $(seq 1 120); do
    if ETCDCTL_API=3 etcdctl --endpoints="$endpoints" --dial-timeout=1s --command-timeout=2s \
      endpoint health >/dev/null 2>&1; then
      echo "etcd $what: healthy on $endpoints"
      return 0
    fi
    sleep 0.5
  done
  ETCDCTL_API=3 etcdctl --endpoints="$endpoints" endpoint health || true
  echo "etcd $what did not become healthy" >&2
  return 1
}

# Starts both clusters under DIR and sets (exports) the variables.
etcd_start() {
  local dir=$1
  mkdir -p "$dir"
  ETCD_SCRATCH="$dir"

  local ports client peer
  read -r -a ports <<<"$(etcd_free_ports 8)"
  client=${ports[0]}
  peer=${ports[1]}
  etcd_member "$dir" single "$client" "$peer" "single=http://127.0.0.1:$peer" "leasefence-single-$$"
  local single_endpoint="127.0.0.1:$client"

  local cdir="$dir/cluster" initial="" names=(m1 m2 m3) clients peers i
  clients=("${ports[2]}" "${ports[3]}" "${ports[4]}")
  peers=("${ports[5]}" "${ports[6]}" "${ports[7]}")
  mkdir -p "$cdir"
  for i in 0 1 2; do
    initial="${initial:+$initial,}${names[$i]}=http://127.0.0.1:${peers[$i]}"
  done
  printf '%s\n' "${names[@]}" >"$cdir/members"
  local addrs=()
  for i in 0 1 2; do
    etcd_member "$cdir" "${names[$i]}" "${clients[$i]}" "${peers[$i]}" "$initial" "leasefence-cluster-$$"
    addrs+=("127.0.0.1:${clients[$i]}")
  done

  if ! etcd_healthy single "http://$single_endpoint"; then
    tail -n 40 "$dir/single/log" >&2
    return 1
  fi
  local joined
  joined="$(IFS=,; echo "${addrs[*]}")"
  if ! etcd_healthy cluster "$(printf 'http://%s,' "${addrs[@]}" | sed 's/,$//')"; then
    tail -n 20 "$cdir"/m*/log >&2
    return 1
  fi

  export LEASEFENCE_TEST_ETCD_URL="etcd://$single_endpoint"
  export LEASEFENCE_TEST_ETCD_CLUSTER_URLS="etcd://$joined"
  export LEASEFENCE_TEST_ETCD_CLUSTER_DIR="$cdir"
  {
    echo "export LEASEFENCE_TEST_ETCD_URL=$LEASEFENCE_TEST_ETCD_URL"
    echo "export LEASEFENCE_TEST_ETCD_CLUSTER_URLS=$LEASEFENCE_TEST_ETCD_CLUSTER_URLS"
    echo "export LEASEFENCE_TEST_ETCD_CLUSTER_DIR=$LEASEFENCE_TEST_ETCD_CLUSTER_DIR"
  } >"$dir/env"
}

# Stops every member started under DIR (default: the last etcd_start's), by
# the pids the members' start scripts wrote.
etcd_stop() {
  local dir=${1:-${ETCD_SCRATCH:-}} pidfile pid
  [ -n "$dir" ] && [ -d "$dir" ] || return 0
  for pidfile in "$dir"/single/pid "$dir"/cluster/*/pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill -9 "$pid" 2>/dev/null || true
  done
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
  # Sourced from .ci/run: its trap removes "$scratch" and calls etcd_stop.
  etcd_install
  etcd_start "${scratch:?.ci/run sets scratch}/etcd"
else
  set -euo pipefail
  case "${1:-}" in
    --stop)
      etcd_stop "${2:?usage: $0 --stop DIR}"
      ;;
    "" | -*)
      echo "usage: $0 DIR | $0 --stop DIR" >&2
      exit 2
      ;;
    *)
      etcd_install
      etcd_start "$(realpath -m "$1")"
      echo "source $(realpath -m "$1")/env for the variables; stop with: $0 --stop $1"
      ;;
  esac
fi
