"""Sample outputs of the load generators, as they print them, and a phase's CPU accounting."""

import copy

# wrk 4.1.0 -t1 -c64 -d10s with WRK_LUA: its own summary, then the line done() prints.
WRK_STDOUT = """\
Running 10s test @ http://127.0.0.1:18080/fake/v1/chat/completions
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.14ms  201.37us   8.02ms   91.20%
    Req/Sec    56.39k     1.02k   58.11k    74.00%
  561076 requests in 10.00s, 630.32MB read
Requests/sec:  56107.60
Transfer/sec:     63.03MB
WRKJSON {"requests":561076,"duration_us":10000012,"bytes":660935528,"connect":0,"read":3,"write":0,"status":2,"timeout":1,"p50_us":1106,"p99_us":1874}
"""

# oha 1.16.0 --output-format json, -q 1000 -z 20s --latency-correction (some fields shortened).
OHA_JSON = {
    "summary": {
        "successRate": 0.9999,
        "total": 20.001231,
        "slowest": 0.004127,
        "fastest": 0.000121,
        "average": 0.000262,
        "requestsPerSec": 999.94,
        "totalData": 20376962,
        "sizePerRequest": 1019,
        "sizePerSec": 1018768.2,
    },
    "responseTimeHistogram": {"0.000121": 1, "0.000522": 19950, "0.004127": 49},
    "latencyPercentiles": {
        "p10": 0.000188, "p25": 0.000214, "p50": 0.000249801, "p75": 0.000291, "p90": 0.000357,
        "p95": 0.000421, "p99": 0.000669311, "p99.9": 0.00205035, "p99.99": 0.003911,
    },
    "rps": {"mean": 1000.1, "stddev": 11.2, "max": 1040.0, "min": 960.0,
            "percentiles": {"p10": 985.0, "p50": 1000.0, "p90": 1014.0}},
    "details": {"DNSDialup": {"average": 0.00021, "fastest": 0.00009, "slowest": 0.0006},
                "DNSLookup": {"average": 0.000002, "fastest": 0.000001, "slowest": 0.000008}},
    "statusCodeDistribution": {"200": 19996, "502": 2},
    "errorDistribution": {"connection closed before message completed": 2},
}

# bench/sse_client.py: 5 rounds of 200 streams of 20 events, one stream cut short.
SSE_JSON = {
    "streams": 1000, "completed": 999, "incomplete": 1, "errors": 1, "error_kinds": {"timeout": 1},
    "non_2xx": 0, "expected_data_events": 20,
    "head_p50_ms": 2.101, "head_p99_ms": 6.402, "ttfb_p50_ms": 2.187, "ttfb_p99_ms": 6.533,
    "ttfb_max_ms": 9.01, "total_p50_ms": 231.442, "total_p99_ms": 240.118, "total_max_ms": 251.9,
    "total_min_ms": 228.3, "max_in_flight": 200, "round_ms": [262.1, 250.3, 249.8, 251.0, 250.2],
    "ttfb_p50_ms_by_round": [4.102, 2.01, 2.0, 2.03, 2.011], "ttfb_p99_ms_by_round": [9.0, 5.1, 5.0, 5.2, 5.0],
}


def oha_json():
    return copy.deepcopy(OHA_JSON)


def sse_json():
    return copy.deepcopy(SSE_JSON)


def phase(**over):
    """A Phase.end() result: 10 s of wall time, the proxy's CPU, the cores' busy time."""
    d = {"wall_s": 10.0, "cpu_s": 5.0, "sched_s": 5.5, "core0_busy_pct": 50.0, "core1_busy_pct": 95.0,
         "other_cpu_pct": 1.5, "steal_pct": 0.0}
    d.update(over)
    return d
