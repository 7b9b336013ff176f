"""Where the live job's CPU goes: `cep run --once` variants run in turn over one loaded topic
(bench.live_ceiling's input), with the CPU of each process of the job (the JVM, the Python
workers, the driver's Python) and of each JVM thread (by name, from /proc) between the end of
batch MARK and of batch END: the steady micro-batches, per input row. Per-row CPU, unlike
rows/s, holds up on a loaded machine. Optional: py-spy of the Python workers (SPY=seconds
after start; raw stacks in each run's directory), a JFR recording of the JVM from batch MARK
(JFR=1; `jfr print --stack-depth 80 --events jdk.ExecutionSample rec.jfr`), Spark's event log
(STAGES=1: each micro-batch's map and stateful stages, `bench.live_stages`, medians after
batch MARK under "stages").

    python -m bench.live_cpu 400000 20000 2 new=. base=/tmp/old "s4=.:ARGS=--shards 4"

Each variant is name=checkout[:ENV=V,...] (JOB=noop: bench.live_ceiling's no-op job instead
of `cep run`, `run_noop`; ARGS: extra `cep run` arguments; CONF: Spark
settings, "CONF=spark.a=1+spark.b=2", through spark-submit: a setting the job makes itself,
e.g. `spark.shuffle.compress` on a local master, wins over it). MARK (default 3)
and END (default 19) are the batches; END must be a batch the run reaches. Session 13
(bench/results/latency_live.md, "Session 13, live13t").
"""
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.latency import BENCH_RULES, Services, progress_reports
from bench.live_ceiling import NOOP_JOB, _fresh, _steady, load_topic
from bench.live_stages import batches, summary

TCK = os.sysconf("SC_CLK_TCK")


def procs(session):
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            rest = open(f"/proc/{d}/stat").read().rpartition(")")[2].split()
            if int(rest[3]) != session:
                continue
            cmd = open(f"/proc/{d}/cmdline").read().replace("\0", " ")
        except OSError:
            continue
        out[int(d)] = (cmd, sum(int(x) for x in rest[11:13]))  # own utime+stime
    return out


def threads(pid):
    out = {}
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                s = open(f"/proc/{pid}/task/{t}/stat").read()
            except OSError:
                continue
            name = s[s.index("(") + 1:s.rindex(")")]
            rest = s.rpartition(")")[2].split()
            out[int(t)] = (name, int(rest[11]) + int(rest[12]))
    except OSError:
        pass
    return out


def kind(cmd):
    if "java" in cmd.split(" ")[0]:
        return "jvm"
    if "worker_daemon" in cmd or "pyspark.daemon" in cmd:
        return "pyworker"
    if "cep.cli" in cmd:
        return "driver-py"
    return cmd[:40]


def run(services, work, topic, batch, name, code, env_extra, spy):
    d = _fresh(work / name)
    if env_extra.pop("JOB", "") == "noop":
        return run_noop(services, d, topic, batch, name, code, env_extra)
    args = env_extra.pop("ARGS", "").split()  # `cep run` arguments, not the child's environment
    # Spark settings for the job ("CONF=k=v+k2=v2"), through spark-submit's arguments
    confs = [c for c in env_extra.pop("CONF", "").split("+") if c]
    submit = "".join(f"--conf {c} " for c in confs)
    (d / "rules").mkdir()
    (d / "rules" / "fraud.cep").write_text(BENCH_RULES.read_text())
    env = {**os.environ, "CEP_KAFKA_BOOTSTRAP": services.bootstrap,
           "CEP_REDIS_URL": services.redis_url, "CEP_SPARK_MASTER": "local[2]",
           "CEP_DEAD_LETTER_TOPIC": f"{topic}-dlq", "CEP_LATE_TOPIC": f"{topic}-late",
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": code, "OPENBLAS_NUM_THREADS": "1",
           **env_extra}
    cmd = [sys.executable, "-m", "cep.cli", "run", "--rules", str(d / "rules"),
           "--checkpoint", str(d / "ck"), "--topic", f"transactions={topic}",
           "--starting-offsets", "earliest", "--once", "--max-offsets-per-trigger", str(batch)]
    cmd += args
    if os.environ.get("STAGES"):  # Spark's event log, for the stages' times (bench.live_stages)
        (d / "events").mkdir()
        submit += ("--conf spark.eventLog.enabled=true --conf "
                   f"spark.eventLog.dir=file://{d / 'events'} ")
    if submit:
        env["PYSPARK_SUBMIT_ARGS"] = submit + "pyspark-shell"
    t0 = time.monotonic()
    last = {}
    lastth = {}
    spies = []
    spied = set()
    mark = None  # (proc cpu, thread cpu) snapshot when batch MARK's progress line is logged
    logp = d / "run.log"
    MARK = int(os.environ.get("MARK", "3"))
    END = int(os.environ.get("END", "19"))
    endm = None
    with (d / "run.log").open("wb") as f:
        p = subprocess.Popen(cmd, cwd=code, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        while p.poll() is None:
            ps = procs(p.pid)
            for pid, (cmd_, t) in ps.items():
                last[pid] = (cmd_, t)
                if kind(cmd_) == "jvm":
                    for tid, v in threads(pid).items():
                        lastth[tid] = v
                if spy and kind(cmd_) == "pyworker" and pid not in spied and \
                        time.monotonic() - t0 > spy:
                    spied.add(pid)
                    out = d / f"spy-{pid}.txt"
                    spies.append(subprocess.Popen(
                        [str(Path(sys.executable).with_name("py-spy")), "record", "-p",
                         str(pid), "-r", "200", "-f", "raw", "-o", str(out),
                         "-d", "60", "--nonblocking"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            text = logp.read_text(errors="replace") if endm is None else ""
            if mark is None and f'"batch": {MARK},' in text:
                mark = ({pid: v for pid, v in last.items()}, dict(lastth), time.monotonic() - t0)
                if os.environ.get("JFR"):
                    jpid = max((t, pid) for pid, (c, t) in last.items() if kind(c) == "jvm")[1]
                    subprocess.run(["jcmd", str(jpid), "JFR.start", "duration=25s",
                                    "settings=profile", f"filename={d}/rec.jfr"],
                                   capture_output=True)
            if endm is None and f'"batch": {END},' in text:
                endm = ({pid: v for pid, v in last.items()}, dict(lastth), time.monotonic() - t0)
            time.sleep(0.3)
    wall = time.monotonic() - t0
    for s in spies:
        s.wait(timeout=90)
    by = Counter()
    for c, t in last.values():
        by[kind(c)] += t / TCK
    per_proc = sorted(((t / TCK, kind(c), pid) for pid, (c, t) in last.items()), reverse=True)
    th = Counter()
    for tname, t in lastth.values():
        key = tname.rstrip("0123456789#-")
        th[key] += t / TCK
    progress = [{"numInputRows": q.get("input_rows"), "durationMs": q.get("durations_ms") or {},
                 "collect": (q.get("last_delivery") or {}).get("collect_ms"),
                 "state": q.get("state_ms")}
                for q in progress_reports((d / "run.log").read_text(errors="replace"))]
    st = _steady(progress, 2)
    counters = (json.loads((d / "ck" / "metrics.json").read_text()).get("counters") or {}) \
        if (d / "ck" / "metrics.json").exists() else {}
    steady = {}
    if mark is not None and endm is not None:
        m0, th0, tm = mark
        last, lastth, tend = endm
        wall = tend
        steady = steady_cpu(m0, th0, last, lastth, tend - tm, progress[MARK + 1:END + 1])
    else:
        print(f"warning: {name}: no steady figures: the progress line of batch "
              f"{MARK if mark is None else END} never appeared ({len(progress)} batches logged; "
              f"set MARK/END within them, END < events / batch)", file=sys.stderr, flush=True)
    res = {"name": name, "steady": steady, "rc": p.returncode, "wall": round(wall, 1),
           "load": os.getloadavg(),
           "rows_per_s": st["rows_per_s"], "batch_ms": st["batch_ms"],
           "cpu": {k: round(v, 1) for k, v in by.items()},
           "procs": [(round(a, 1), b, c) for a, b, c in per_proc[:8]],
           "jvm_threads": {k: round(v, 1) for k, v in th.most_common(14)},
           "ops": {k: counters.get(k, 0) // 1000 for k in
                   ("python_us", "engine_us", "store_us", "timer_us", "encode_us", "write_us",
                    "rows_in_us", "prepare_us", "init_us", "load_us", "read_us", "unzip_us",
                    "import_us", "reload_us")},
           "state": {k: counters.get(k, 0) for k in
                     ("state_reloads", "state_catchups", "state_reads", "state_compactions")},
           "durations": [p["durationMs"] | {"collect": p["collect"]} for p in progress]}
    if os.environ.get("STAGES"):
        res["stages"] = summary(batches(d / "events")[MARK:])
    return res


def steady_cpu(p0, th0, p1, th1, wall, progress):
    """CPU per process kind and per JVM thread between two samples (`procs`, `threads`) and
    per row of the batches between them (`progress`)."""
    byk = Counter()
    for pid, (c, t) in p1.items():
        byk[kind(c)] += (t - p0.get(pid, (c, 0))[1]) / TCK
    tk = Counter()
    for tid, (nm, t) in th1.items():
        tk[nm.rstrip("0123456789#-")] += (t - th0.get(tid, (nm, 0))[1]) / TCK
    rows = sum(int(q["numInputRows"] or 0) for q in progress)
    return {"rows": rows, "wall": round(wall, 1),
            "cpu": {k: round(v, 2) for k, v in byk.items() if v > 0.05},
            "us_per_row": {k: round(1e6 * v / max(rows, 1), 1)
                           for k, v in byk.items() if v > 0.05},
            "jvm_threads_us_per_row": {k: round(1e6 * v / max(rows, 1), 1)
                                       for k, v in tk.most_common(16)}}


def run_noop(services, d, topic, batch, name, code, env_extra):
    """bench.live_ceiling's no-op job (`NOOP_JOB`, unchanged; "name=CHECKOUT:JOB=noop"), with
    the same per-process and per-thread CPU between the ends of batches MARK and END. The
    no-op logs no progress while it runs, so the CPU is sampled over time and the window is
    placed afterwards from its progress reports' start times (the end of batch N = the start
    of batch N + 1)."""
    from cep.config import Settings

    out = d / "out.json"
    env = {**os.environ, "PYTHONPATH": code, "OPENBLAS_NUM_THREADS": "1", **env_extra}
    cmd = [sys.executable, "-c", NOOP_JOB, services.bootstrap, topic, str(batch),
           str(Settings().live_shards), str(d / "ck"), str(out)]
    series = []  # (wall-clock time, {pid: (cmd, cpu)}, {tid: (name, cpu)})
    t0 = time.monotonic()
    with (d / "run.log").open("wb") as f:
        p = subprocess.Popen(cmd, cwd=code, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        while p.poll() is None:
            ps = procs(p.pid)
            th = {}
            for pid, (cmd_, _) in ps.items():
                if kind(cmd_) == "jvm":
                    th.update(threads(pid))
            series.append((time.time(), ps, th))
            time.sleep(0.3)
    wall = time.monotonic() - t0
    res = json.loads(out.read_text()) if out.exists() else {"progress": []}
    progress = res["progress"]
    MARK = int(os.environ.get("MARK", "3"))
    END = int(os.environ.get("END", "19"))
    steady = {}
    if len(progress) > END + 1:
        from datetime import datetime

        def at(i):
            return datetime.fromisoformat(progress[i]["timestamp"].replace("Z", "+00:00")) \
                .timestamp()

        def snap(t):  # the last sample at or before t
            return max((s for s in series if s[0] <= t), key=lambda s: s[0], default=series[0])

        (ta, p0, th0), (tb, p1, th1) = snap(at(MARK + 1)), snap(at(END + 1))
        steady = steady_cpu(p0, th0, p1, th1, tb - ta, progress[MARK + 1:END + 1])
    st = _steady(progress, 2)
    return {"name": name, "steady": steady, "rc": p.returncode, "wall": round(wall, 1),
            "load": os.getloadavg(), "rows_per_s": st["rows_per_s"], "batch_ms": st["batch_ms"],
            "durations": [q["durationMs"] for q in progress]}


def main():
    events, batch, rounds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    spy = float(os.environ.get("SPY", "0"))
    variants = []
    for a in sys.argv[4:]:
        name, _, rest = a.partition("=")
        code, _, envs = rest.partition(":")
        env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
        variants.append((name, code, env))
    work = Path(os.environ.get("WORK", "/tmp/cep-live-cpu"))
    work.mkdir(parents=True, exist_ok=True)
    services = Services(work / "services")
    results = []
    try:
        services.start()
        topic = f"prof-{os.getpid()}"
        load_topic(services.bootstrap, topic, events, 20000)
        for r in range(rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for name, code, env in order:
                res = run(services, work, topic, batch, f"{name}-{r}", code, dict(env), spy)
                results.append(res)
                short = {k: v for k, v in res.items() if k != "durations"}
                print(json.dumps(short), flush=True)
    finally:
        services.stop()
    Path(os.environ.get("OUT", "live_cpu.json")).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
