"""Reading /proc: a process's CPU time, memory, group and children, and each core's busy time.

Each reader has a parser of the file's text beside it, so that the parsing is tested without /proc.
"""

import os

from .common import CLK_TCK


def stat_fields(text):
    """The fields of /proc/PID/stat after the command name (which may hold spaces and parentheses):
    [0] is the state, [1] the parent pid, [2] the process group, [11] utime, [12] stime."""
    return text[text.rindex(")") + 2 :].split()


def read_stat(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read()


def pgrp_of(pid):
    try:
        s = read_stat(pid)
    except OSError:
        return None
    return int(stat_fields(s)[2])


def group_members(pgid):
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and pgrp_of(int(d)) == pgid]


def stat_cpu_s(text, clk_tck=CLK_TCK):
    """utime+stime in seconds from the text of /proc/PID/stat."""
    rest = stat_fields(text)
    return (int(rest[11]) + int(rest[12])) / clk_tck


def proc_cpu_s(pid):
    """utime+stime of a process (all its threads) in seconds, from /proc/PID/stat."""
    return stat_cpu_s(read_stat(pid))


def proc_sched_s(pid):
    """Time on CPU of every live thread of a process in seconds, from /proc/PID/task/*/schedstat
    (nanosecond scheduler accounting; threads that already exited are not included)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e9


def status_switches(lines):
    """(voluntary, involuntary) context switches in the lines of a thread's /proc/.../status."""
    vol = invol = 0
    for line in lines:
        if line.startswith("voluntary_ctxt_switches:"):
            vol = int(line.split()[1])
        elif line.startswith("nonvoluntary_ctxt_switches:"):
            invol = int(line.split()[1])
    return vol, invol


def proc_switches(pid):
    """(voluntary, involuntary) context switches of every live thread of a process, from
    /proc/PID/task/*/status (a thread that exited between two readings takes its count with it:
    tokio's blocking threads do after 10 s idle, none of them in a measured phase)."""
    vol = invol = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                v, i = status_switches(f)
        except (OSError, ValueError, IndexError):
            continue
        vol, invol = vol + v, invol + i
    return vol, invol


def status_kib(lines, key):
    """The value in KiB of `key` (VmRSS, VmHWM, ...) in the lines of /proc/PID/status, else 0."""
    for line in lines:
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def proc_status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        return status_kib(f, key)


def proc_pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def child_pids(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            s = read_stat(d)
        except OSError:
            continue
        if int(stat_fields(s)[1]) == pid:
            out.append(int(d))
    return sorted(out)


def parse_cpu_stat(lines, clk_tck=CLK_TCK):
    """Per-core busy and steal seconds from the lines of /proc/stat: {"cpu": (busy, steal),
    "cpu0": ..., ...}. Busy is user + nice + system + irq + softirq."""
    out = {}
    for line in lines:
        if line.startswith("cpu"):
            name, *v = line.split()
            v = [int(x) for x in v] + [0] * 10
            # user nice system idle iowait irq softirq steal ...
            out[name] = ((v[0] + v[1] + v[2] + v[5] + v[6]) / clk_tck, v[7] / clk_tck)
    return out


def cpu_stat():
    """Per-core busy and steal seconds from /proc/stat: {"cpu0": (busy, steal), ...}."""
    with open("/proc/stat") as f:
        return parse_cpu_stat(f)
