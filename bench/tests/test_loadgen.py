"""Running the load generators (with a stand-in for the process runner) and reading their output."""

import subprocess
import sys
import types

import pytest

from benchkit import loadgen
from benchkit.common import BenchError
from samples import OHA_JSON, WRK_STDOUT, oha_json


class Recorder:
    """Procs.run_tool's stand-in: records the command, answers with a fixed output."""

    def __init__(self, out, rc=0):
        self.out, self.rc, self.calls = out, rc, []

    def run_tool(self, name, argv, cpu, timeout):
        self.calls.append((name, [str(a) for a in argv], cpu, timeout))
        return self.rc, self.out, "some stderr"


def test_parse_wrk_takes_the_wrkjson_line():
    w = loadgen.parse_wrk(WRK_STDOUT)
    assert w == {"requests": 561076, "duration_us": 10000012, "bytes": 660935528, "connect": 0, "read": 3,
                 "write": 0, "status": 2, "timeout": 1, "p50_us": 1106, "p99_us": 1874}
    assert loadgen.wrk_errors(w) == 4
    assert loadgen.wrk_lost(w) == 6


def test_parse_wrk_without_summary_is_none():
    assert loadgen.parse_wrk(WRK_STDOUT.split("WRKJSON")[0]) is None
    assert loadgen.parse_wrk("") is None


def test_oha_summary():
    s = loadgen.oha_summary(oha_json())
    assert s["requests"] == 19996 + 2 + 2  # answered, whatever the status, and failed
    assert s["ok"] == 19996
    assert s["non2xx"] == 2
    assert s["errors"] == 2
    assert s["error_kinds"] == {"connection closed before message completed": 2}
    assert s["rps"] == 999.94
    assert (s["p50_s"], s["p99_s"], s["p999_s"], s["max_s"]) == (0.000249801, 0.000669311, 0.00205035, 0.004127)


def test_oha_summary_of_a_run_without_answers():
    s = loadgen.oha_summary({"summary": {}, "statusCodeDistribution": None, "errorDistribution": {"refused": 5}})
    assert (s["requests"], s["ok"], s["non2xx"], s["errors"], s["p50_s"], s["rps"]) == (5, 0, 0, 5, None, None)


def test_run_wrk_command_script_and_summary(tmp_path):
    r = Recorder(WRK_STDOUT)
    w = loadgen.run_wrk(r, tmp_path, "http://127.0.0.1:18080/fake/v1/chat/completions", 10, 64, "r0-rebound-thr")
    assert w["requests"] == 561076
    name, argv, cpu, timeout = r.calls[0]
    script = tmp_path / "wrk-r0-rebound-thr.lua"
    assert (name, cpu, timeout) == ("wrk", "1", 40)
    assert argv[1:] == ["-t1", "-c64", "-d10s", "--timeout", "5s", "-s", str(script),
                        "http://127.0.0.1:18080/fake/v1/chat/completions"]
    assert 'wrk.headers["x-fake-key"] = "r0-rebound-thr"' in script.read_text()


def test_run_wrk_fails_with_its_output(tmp_path):
    with pytest.raises(BenchError, match=r"wrk failed \(exit 1\):\nunable to connect"):
        loadgen.run_wrk(Recorder("unable to connect to 127.0.0.1:1\n", rc=1), tmp_path, "http://127.0.0.1:1/", 1, 1, "k")


def test_run_oha_command_and_json():
    import json

    r = Recorder(json.dumps(OHA_JSON))
    o = loadgen.run_oha(r, "http://127.0.0.1:19000/v1/chat/completions", 20, 1000, 32, "r0-direct-lat")
    assert o["statusCodeDistribution"] == {"200": 19996, "502": 2}
    name, argv, cpu, timeout = r.calls[0]
    assert (name, cpu, timeout) == ("oha", "1", 80)
    assert argv[1:] == ["--no-tui", "--output-format", "json", "-z", "20s", "-c", "32", "-q", "1000",
                        "--latency-correction", "-w", "-m", "POST", "-d", "{}", "-T", "application/json",
                        "-H", "x-fake-key: r0-direct-lat", "http://127.0.0.1:19000/v1/chat/completions"]


def test_run_oha_fails_with_the_ends_of_its_output():
    with pytest.raises(BenchError) as e:
        loadgen.run_oha(Recorder("x" * 5000, rc=2), "u", 1, 1, 1, "k")
    assert str(e.value) == "oha failed (exit 2):\n" + "x" * 2000 + "\nsome stderr"


def test_run_sse_command():
    args = types.SimpleNamespace(sse_streams=200, sse_events=20, sse_gap_ms=10, sse_rounds=5)
    r = Recorder('{"streams": 1000}')
    assert loadgen.run_sse(r, args, "http://127.0.0.1:18080/x", "r1-sse", shared_key=True) == {"streams": 1000}
    name, argv, cpu, timeout = r.calls[0]
    assert (name, cpu, timeout) == ("sse_client", "1", 330)
    assert argv[0] == sys.executable and argv[1].endswith("bench/sse_client.py")
    assert argv[2:] == ["--url", "http://127.0.0.1:18080/x", "--streams", "200", "--events", "20", "--gap-ms", "10",
                        "--rounds", "5", "--timeout", "30", "--key", "r1-sse", "--shared-idempotency-key"]


# A stand-in for wrk running WRK_IDEM_LUA: prints LIMIT, then its summary when stopped with SIGINT.
FAKE_KEYED_WRK = r"""
import signal, sys, time
def done(*_):
    print('WRKJSON {"requests":9000,"duration_us":1500000,"connect":0,"read":0,"write":0,"status":0,'
          '"timeout":0,"p50_us":700,"p99_us":2100}', flush=True)
    sys.exit(0)
signal.signal(signal.SIGINT, done)
print("Running 2m test", flush=True)
print("LIMIT", flush=True)
time.sleep(20)
"""


class KeyedProcs:
    def __init__(self, script):
        self.script, self.stopped = script, []

    def spawn(self, name, argv, cpu, logfile=None, capture=False, nofile=None):
        self.argv = [str(a) for a in argv]
        return subprocess.Popen([sys.executable, "-c", self.script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def stop(self, p, sig=None):
        if p.poll() is None:
            p.kill()
        p.wait()
        self.stopped.append(p)


def test_run_wrk_keyed_ends_the_phase_at_the_limit(tmp_path):
    procs = KeyedProcs(FAKE_KEYED_WRK)
    seen = []
    w, marked = loadgen.run_wrk_keyed(procs, tmp_path, "http://127.0.0.1:18080/x", 9000, 64, "r0-idem0-empty", 120,
                                      at_limit=lambda pid: seen.append(pid) or "phase ended")
    assert marked == "phase ended" and len(seen) == 1
    assert w["requests"] == 9000 and w["p99_us"] == 2100
    assert procs.argv[1:4] == ["-t1", "-c64", "-d120s"]
    script = (tmp_path / "wrk-r0-idem0-empty.lua").read_text()
    assert "local sent, answered, limit = 0, 0, 9000" in script
    assert len(procs.stopped) == 1


def test_run_wrk_keyed_fails_when_wrk_ends_before_the_limit(tmp_path):
    early = FAKE_KEYED_WRK.replace('print("LIMIT", flush=True)', "done()")
    with pytest.raises(BenchError, match="wrk ended before 9000 responses"):
        loadgen.run_wrk_keyed(KeyedProcs(early), tmp_path, "http://127.0.0.1:18080/x", 9000, 64, "k", 120)
