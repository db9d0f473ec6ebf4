"""Parsing /proc, and a phase's CPU accounting from two snapshots."""

import pytest

from benchkit.phase import phase_delta
from benchkit.procstat import parse_cpu_stat, stat_cpu_s, stat_fields, status_kib, status_switches

# /proc/PID/stat of a process whose name holds a space and a parenthesis
STAT = ("4242 (rebound (x) y) S 4100 4242 4100 0 -1 4194560 2050 0 0 0 1234 567 0 0 20 0 2 0 889123 "
        "123456789 2200 18446744073709551615 1 1 0 0 0 0 0 4096 17926 0 0 0 17 0 0 0 0 0 0")

PROC_STAT = """\
cpu  10132153 290696 3084719 46828483 16683 0 25195 175 0 0
cpu0 5166150 145340 1540325 23414259 8342 0 12810 90 0 0
cpu1 4966003 145356 1544394 23414224 8341 0 12385 85 0 0
intr 1462898 28 9 0 0 0 0 0 0 1 0
ctxt 2210453
btime 1733390000
processes 54321
"""

STATUS = """\
Name:\trebound
VmPeak:\t  104580 kB
VmHWM:\t   12004 kB
VmRSS:\t    8512 kB
Threads:\t2
"""


def test_stat_fields_after_the_command_name():
    f = stat_fields(STAT)
    assert (f[0], f[1], f[2]) == ("S", "4100", "4242")  # state, parent, process group
    assert stat_cpu_s(STAT, clk_tck=100) == pytest.approx(18.01)  # (1234 + 567) ticks


def test_status_kib():
    lines = STATUS.splitlines(keepends=True)
    assert status_kib(lines, "VmRSS") == 8512
    assert status_kib(lines, "VmHWM") == 12004
    assert status_kib(lines, "VmSwap") == 0


def test_parse_cpu_stat():
    s = parse_cpu_stat(PROC_STAT.splitlines(), clk_tck=100)
    assert sorted(s) == ["cpu", "cpu0", "cpu1"]
    busy, steal = s["cpu0"]
    assert busy == pytest.approx((5166150 + 145340 + 1540325 + 0 + 12810) / 100)  # user nice system irq softirq
    assert steal == pytest.approx(0.9)
    assert parse_cpu_stat(["cpu2 1 2 3"], clk_tck=100)["cpu2"] == (0.06, 0.0)  # old kernels: fewer columns


def snapshot(t, proxy, upstream, tools, cpu, cpu0, cpu1, steal=0.0):
    return {"t": t, "proxy": proxy, "upstream": upstream, "tools": tools,
            "stat": {"cpu": (cpu, steal), "cpu0": (cpu0, 0.0), "cpu1": (cpu1, 0.0)}}


def test_phase_delta():
    a = snapshot(100.0, (10.0, 10.5), 3.0, 1.0, 1000.0, 400.0, 600.0)
    b = snapshot(110.0, (19.0, 19.7), 7.0, 5.5, 1019.0, 409.2, 609.8, steal=0.2)
    d = phase_delta(a, b)
    assert d["wall_s"] == 10.0
    assert d["cpu_s"] == pytest.approx(9.0) and d["sched_s"] == pytest.approx(9.2)
    assert d["core0_busy_pct"] == pytest.approx(92.0) and d["core1_busy_pct"] == pytest.approx(98.0)
    # machine busy 19 s - (proxy 9 + upstream 4 + tools 4.5) = 1.5 s over 10 s
    assert d["other_cpu_pct"] == pytest.approx(15.0)
    assert d["steal_pct"] == pytest.approx(2.0)


def test_phase_delta_without_a_proxy_never_goes_below_zero():
    a = snapshot(0.0, None, 0.0, 0.0, 0.0, 0.0, 0.0)
    b = snapshot(5.0, None, 4.0, 3.0, 6.5, 0.5, 6.0)
    d = phase_delta(a, b)
    assert d["cpu_s"] is None and d["sched_s"] is None
    assert d["other_cpu_pct"] == 0.0  # 6.5 s busy, 7 s accounted for: tick rounding


def test_status_switches():
    lines = (STATUS + "voluntary_ctxt_switches:\t1520\nnonvoluntary_ctxt_switches:\t37\n").splitlines(keepends=True)
    assert status_switches(lines) == (1520, 37)
    assert status_switches(STATUS.splitlines(keepends=True)) == (0, 0)


def test_a_phase_counts_the_switches_between_its_snapshots():
    def snap(t, switches):
        return {"t": t, "proxy": (1.0, 1.0), "switches": switches, "upstream": 0.0, "tools": 0.0,
                "stat": {"cpu": (0, 0), "cpu0": (0, 0), "cpu1": (0, 0)}}
    d = phase_delta(snap(0.0, (100, 10)), snap(2.0, (400, 25)))
    assert (d["vol_switches"], d["invol_switches"]) == (300, 15)
    assert "vol_switches" not in phase_delta(snap(0.0, None), snap(2.0, None))
