"""What the host did to this process during a run: the evidence a start-to-start spread needs.

    before = host.sample(); ...run...; figures = host.since(before)

cpu_share      cpu time / (cpu time + run-queue wait + steal): the share of the time its threads
               wanted a cpu that they got one (1.0: nobody else took the cores)
runq_wait_ms   time this process's threads were ready to run but waited for a cpu (summed over
               threads, /proc/self/task/*/schedstat): other processes of this VM took the cores
steal_ms       time the hypervisor ran something else on this process's cpus (/proc/stat
               steal): other VMs took the host
migrations     thread moves between cpus (/proc/self/task/*/sched, when the kernel has it)
cpus_of_busy   the cpu each of the busiest threads last ran on ("0,1": two threads on two cpus)
huge_mb        anonymous memory on transparent huge pages now (/proc/self/smaps_rollup)
huge_share     huge_mb over all anonymous memory of the process (weights, KV cache, workspaces)
"""
import os


def _tasks():
    path = "/proc/self/task"
    for tid in os.listdir(path):
        yield os.path.join(path, tid)


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _threads() -> dict:
    """tid path -> (cpu ns, run-queue wait ns, migrations, last cpu)."""
    out = {}
    for task in _tasks():
        sched = _read(os.path.join(task, "schedstat")).split()
        if len(sched) < 2:
            continue
        migrations = 0
        for line in _read(os.path.join(task, "sched")).splitlines():
            if line.startswith("se.nr_migrations"):
                migrations = int(line.split(":")[1])
        stat = _read(os.path.join(task, "stat"))
        fields = stat[stat.rfind(")") + 2:].split()
        cpu = int(fields[36]) if len(fields) > 36 else -1  # field 39 of stat: the last cpu
        out[task] = (int(sched[0]), int(sched[1]), migrations, cpu)
    return out


def _steal_ticks(cpus) -> int:
    wanted = {f"cpu{c}" for c in cpus}
    total = 0
    for line in _read("/proc/stat").splitlines():
        name, _, rest = line.partition(" ")
        if name in wanted:
            fields = rest.split()
            total += int(fields[7]) if len(fields) > 7 else 0
    return total


def sample() -> dict:
    return {"threads": _threads(), "steal": _steal_ticks(os.sched_getaffinity(0))}


def _rollup_mb(field: str):
    for line in _read("/proc/self/smaps_rollup").splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return None


def huge_mb() -> float:
    huge = _rollup_mb("AnonHugePages")
    return None if huge is None else round(huge)


def huge_share():
    huge, anon = _rollup_mb("AnonHugePages"), _rollup_mb("Anonymous")
    return round(huge / anon, 3) if huge is not None and anon else None


def since(before: dict) -> dict:
    now = sample()
    cpu = wait = moved = 0
    busy = []
    for task, (c, w, m, last) in now["threads"].items():
        c0, w0, m0, _ = before["threads"].get(task, (0, 0, 0, 0))
        cpu, wait, moved = cpu + c - c0, wait + w - w0, moved + m - m0
        busy.append((c - c0, last))
    busy.sort(reverse=True)
    steal = (now["steal"] - before["steal"]) * 1e9 / os.sysconf("SC_CLK_TCK")
    wanted = cpu + wait + steal
    return {"cpu_share": round(cpu / wanted, 3) if wanted else 1.0,
            "runq_wait_ms": round(wait / 1e6), "cpu_ms": round(cpu / 1e6),
            "steal_ms": round(steal / 1e6), "migrations": moved,
            "cpus_of_busy": ",".join(str(last) for _, last in busy[:2]), "huge_mb": huge_mb(),
            "huge_share": huge_share()}
