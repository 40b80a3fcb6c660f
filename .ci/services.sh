#!/usr/bin/env bash
# Makes sure the services the tests need are up: PostgreSQL, Redis, NATS (with
# JetStream) and RabbitMQ on their standard loopback ports (the machine runs
# them; start them if they stopped).
set -euo pipefail

wait_for() { # name, command...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then echo "$name: up"; return 0; fi
    sleep 0.5
  done
  echo "$name: did not come up" >&2
  return 1
}

if ! pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1; then
  echo "PostgreSQL: starting"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
fi
wait_for PostgreSQL pg_isready -h 127.0.0.1 -p 5432

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "Redis: starting"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
wait_for Redis redis-cli -h 127.0.0.1 -p 6379 ping

# A TCP port that accepts connections (NATS and RabbitMQ have no ping here).
port_open() { python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()' "$1"; }

if ! port_open 4222 >/dev/null 2>&1; then
  echo "NATS: starting"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
fi
wait_for NATS port_open 4222

if ! port_open 5672 >/dev/null 2>&1; then
  echo "RabbitMQ: starting"
  rabbitmq-server -detached
fi
# RabbitMQ takes a while to boot: up to 120 s.
for _ in $(seq 1 240); do port_open 5672 >/dev/null 2>&1 && break; sleep 0.5; done
if port_open 5672 >/dev/null 2>&1; then echo "RabbitMQ: up"; else echo "RabbitMQ: did not come up" >&2; exit 1; fi
