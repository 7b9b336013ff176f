#!/usr/bin/env bash
# Single-node Apache Kafka (KRaft: broker + controller in one JVM) on loopback, from the jars that
# scripts/fetch-jars.sh put in .cache/jars/kafka. No Docker, no Kafka distribution tarball.
#
#   scripts/kafka.sh start [--port 9092] [--controller-port 9093] [--dir .run/kafka]
#   scripts/kafka.sh stop  [--dir .run/kafka]
#
# `start` returns once the broker accepts connections (or fails, printing the broker log's tail).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cmd=${1:?usage: kafka.sh start|stop [--port P] [--controller-port P] [--dir DIR]}; shift
port=9092; cport=9093; dir="$root/.run/kafka"
while (( $# )); do
  case $1 in
    --port) port=$2; shift 2;;
    --controller-port) cport=$2; shift 2;;
    --dir) dir=$2; shift 2;;
    *) echo "kafka.sh: unknown option $1" >&2; exit 2;;
  esac
done
jars="$root/.cache/jars/kafka"
pidfile="$dir/kafka.pid"

case $cmd in
stop)
  if [[ -f $pidfile ]]; then
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  fi
  exit 0;;
start) ;;
*) echo "kafka.sh: unknown command $cmd" >&2; exit 2;;
esac

[[ -d $jars ]] || { echo "kafka.sh: no broker jars in $jars; run scripts/fetch-jars.sh" >&2; exit 1; }
mkdir -p "$dir/data"
cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=2
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.flush.interval.messages=9223372036854775807
PROPS
cat > "$dir/log4j2.properties" <<PROPS
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $dir/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
PROPS

java_opts=(-Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true
           "-Dlog4j2.configurationFile=$dir/log4j2.properties")
cp="$jars/*"
if [[ ! -f $dir/data/meta.properties ]]; then
  # A KRaft cluster id is 16 random bytes, base64url without padding. One in 64 starts with '-',
  # which the storage tool's argument parser takes for an option ("--cluster-id: expected one
  # argument"): pass it as --cluster-id=ID. CEP_KAFKA_CLUSTER_ID fixes the id (to check that case).
  cluster_id=${CEP_KAFKA_CLUSTER_ID:-$(head -c16 /dev/urandom | base64 | tr "+/" "-_" | tr -d "=")}
  java "${java_opts[@]}" -cp "$cp" kafka.tools.StorageTool format \
       "--cluster-id=$cluster_id" -c "$dir/server.properties" --ignore-formatted > "$dir/format.log" 2>&1 \
    || { echo "kafka.sh: storage format failed:" >&2; cat "$dir/format.log" >&2; exit 1; }
fi
# A restart must not mistake the previous run's "started" line for this one's.
[[ -f $dir/server.log ]] && mv "$dir/server.log" "$dir/server.log.previous"
nohup java "${java_opts[@]}" -cp "$cp" kafka.Kafka "$dir/server.properties" \
  > "$dir/stdout.log" 2>&1 < /dev/null &
echo $! > "$pidfile"
for _ in $(seq 1 600); do
  if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "kafka.sh: broker exited during start-up; last log lines:" >&2
    tail -n 30 "$dir/stdout.log" "$dir/server.log" >&2 2>/dev/null || true
    exit 1
  fi
  if grep -q "Kafka Server started" "$dir/server.log" 2>/dev/null; then
    echo "kafka.sh: broker up on 127.0.0.1:$port (pid $(cat "$pidfile"), dir $dir)" >&2
    exit 0
  fi
  sleep 0.1
done
echo "kafka.sh: broker did not start within 60 s; last log lines:" >&2
tail -n 30 "$dir/server.log" >&2 2>/dev/null || true
exit 1
