#!/usr/bin/env bash
# Redis on loopback from Debian's redis-server (installed by scripts/setup.sh --all).
#   scripts/redis.sh start [--port 6379] [--dir .run/redis]
#   scripts/redis.sh stop  [--dir .run/redis]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:?usage: redis.sh start|stop [--port P] [--dir DIR]}; shift
port=6379; dir="$root/.run/redis"
while (( $# )); do
  case $1 in
    --port) port=$2; shift 2;;
    --dir) dir=$2; shift 2;;
    *) echo "redis.sh: unknown option $1" >&2; exit 2;;
  esac
done
pidfile="$dir/redis.pid"
case $cmd in
stop)
  if [[ -f $pidfile ]]; then
    pid=$(cat "$pidfile"); kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true; rm -f "$pidfile"
  fi
  exit 0;;
start) ;;
*) echo "redis.sh: unknown command $cmd" >&2; exit 2;;
esac
command -v redis-server >/dev/null || { echo "redis.sh: redis-server not installed; run scripts/setup.sh --all" >&2; exit 1; }
mkdir -p "$dir"
# appendonly+everysec: what a deployment would run; the tests restart nothing of Redis' own.
redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --daemonize yes \
  --pidfile "$pidfile" --logfile "$dir/redis.log" --appendonly yes --save "" >/dev/null
for _ in $(seq 1 100); do
  if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then
    echo "redis.sh: redis up on 127.0.0.1:$port (dir $dir)" >&2; exit 0
  fi
  sleep 0.1
done
echo "redis.sh: redis did not answer PING within 10 s:" >&2; tail -n 20 "$dir/redis.log" >&2 || true
exit 1
