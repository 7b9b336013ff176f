#!/usr/bin/env bash
# A Spark standalone cluster on loopback — one master, N workers — from PySpark's own spark-class.
#   scripts/spark-cluster.sh start [--port 7077] [--workers 2] [--dir .run/spark-cluster]
#   scripts/spark-cluster.sh stop  [--dir .run/spark-cluster]
# `start` returns once every worker has registered with the master.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:?usage: spark-cluster.sh start|stop [--port P] [--workers N] [--dir DIR]}; shift
port=7077; workers=2; dir="$root/.run/spark-cluster"
while (( $# )); do
  case $1 in
    --port) port=$2; shift 2;;
    --workers) workers=$2; shift 2;;
    --dir) dir=$2; shift 2;;
    *) echo "spark-cluster.sh: unknown option $1" >&2; exit 2;;
  esac
done
py="$root/.venv/bin/python"
export SPARK_HOME=$("$py" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$py"
class="$SPARK_HOME/bin/spark-class"

stop_all() {
  for pidfile in "$dir"/*.pid; do
    [[ -f $pidfile ]] || continue
    pid=$(cat "$pidfile"); kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true; rm -f "$pidfile"
  done
}

case $cmd in
stop) stop_all; exit 0;;
start) ;;
*) echo "spark-cluster.sh: unknown command $cmd" >&2; exit 2;;
esac

mkdir -p "$dir"
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
nohup "$class" org.apache.spark.deploy.master.Master --host 127.0.0.1 --port "$port" \
  --webui-port "$(free_port)" > "$dir/master.log" 2>&1 < /dev/null &
echo $! > "$dir/master.pid"
for i in $(seq 1 "$workers"); do
  mkdir -p "$dir/worker$i"
  nohup "$class" org.apache.spark.deploy.worker.Worker "spark://127.0.0.1:$port" \
    --host 127.0.0.1 --cores 1 --memory 3g --webui-port "$(free_port)" \
    --work-dir "$dir/worker$i" > "$dir/worker$i.log" 2>&1 < /dev/null &
  echo $! > "$dir/worker$i.pid"
done
for _ in $(seq 1 600); do
  n=$(grep -c "Registering worker" "$dir/master.log" 2>/dev/null || true)
  if [[ ${n:-0} -ge $workers ]]; then
    echo "spark-cluster.sh: master spark://127.0.0.1:$port with $workers workers" >&2; exit 0
  fi
  if ! kill -0 "$(cat "$dir/master.pid")" 2>/dev/null; then
    echo "spark-cluster.sh: the master exited:" >&2; tail -n 30 "$dir/master.log" >&2; exit 1
  fi
  sleep 0.1
done
echo "spark-cluster.sh: workers did not register within 60 s" >&2
tail -n 20 "$dir"/*.log >&2; stop_all; exit 1
