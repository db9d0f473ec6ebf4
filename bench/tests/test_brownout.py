"""The brownout mode: its provider's queue and refusals, its configs, its numbers and targets."""

import asyncio

import pytest

from benchkit import brownout_report as br
from benchkit.brownout import config_text, parse_phases
from benchkit.brownout_provider import Provider, parse_phases as provider_phases

PHASES = [(32, 10.0), (8, 20.0), (32, 10.0)]


def test_phases_parse_alike_in_the_mode_and_the_provider():
    assert parse_phases("32:30,8:60,32:30") == provider_phases("32:30,8:60,32:30") == [(32, 30.0), (8, 60.0), (32, 30.0)]
    with pytest.raises(ValueError):
        provider_phases("0:10")


def test_each_config_adds_what_it_compares_and_no_more():
    table = 'url = "redis://127.0.0.1:16380/0"'
    none, fixed, adaptive = (
        "\n".join(line for line in config_text(0, table, m).splitlines() if not line.startswith("#")) + "\n"
        for m in ("none", "8", "adaptive")
    )
    assert "concurrency" not in none
    assert "\nconcurrency = 8\n" in fixed
    assert '\nconcurrency = "adaptive"\n' in adaptive and "[concurrency]\ninitial = 20" in adaptive
    for text in (none, fixed, adaptive):
        assert text.rstrip().endswith(table)


def test_the_provider_runs_its_capacity_queues_half_as_many_and_refuses_the_rest():
    async def scenario():
        p = Provider([(4, 60.0)], ttft=0.0, events=1, gap=0.0)
        st = p.fresh()
        admitted = [await p.admit(st) for _ in range(4)]
        queued = [asyncio.create_task(p.admit(st)) for _ in range(2)]
        await asyncio.sleep(0)
        refused = await p.admit(st)
        assert admitted == [True] * 4 and refused is False
        assert p.running == 4 and len(p.queue) == 2 and st["most_queued"] == 2
        # One ends: the first queued starts.
        p.running -= 1
        p.release()
        await asyncio.sleep(0)
        assert queued[0].done() and not queued[1].done() and p.running == 4
        queued[1].cancel()

    asyncio.run(scenario())


def test_client_numbers_per_phase():
    records = [
        (1.0, 200, 0.3, True, "", 2.0),
        (2.0, 200, 0.5, True, "", 3.0),
        (3.0, 200, 0.4, False, "", 4.0),  # a stream cut: not goodput
        (9.5, 200, 0.4, True, "", 10.5),  # started in phase 1, delivered in phase 2
        (12.0, 429, None, False, "concurrency_limited", 12.0),
        (13.0, 529, 0.01, False, "", 13.0),
        (35.0, 200, 0.2, True, "", 36.0),
    ]
    stats = br.client_stats(records, PHASES)
    assert [s["requests"] for s in stats] == [4, 2, 1]
    assert stats[0]["goodput"] == pytest.approx(0.2) and stats[1]["goodput"] == pytest.approx(0.05)
    assert stats[0]["ttfb_p99_s"] == 0.5 and stats[1]["ttfb_p99_s"] is None
    assert br.provider_stats([{"calls": 4, "ok": 3, "429": 1, "529": 0, "most_running": 3, "most_queued": 0,
                               "ttft_ms": [200.0, 210.0, 900.0]}])[0]["ttft_p99_ms"] == 900.0
    assert (stats[1]["limited"], stats[1]["failed"]) == (1, 2)
    assert stats[1]["failures"] == {"429 concurrency_limited": 1, "529": 1}
    assert stats[0]["failures"] == {"200 cut": 1}


def test_the_limit_settles_when_it_enters_the_band_and_stays():
    samples = [(1.0, 20), (5.0, 30), (9.5, 33),  # phase 1 (32): in the band from 5 s
               (10.5, 30), (13.0, 12), (16.0, 9), (18.0, 10), (20.0, 6), (29.0, 7),  # phase 2 (8): from 16 s
               (31.0, 8), (39.0, 20)]  # phase 3 (32): never (20 < 24)
    assert br.settle_times(samples, PHASES) == [5.0, 6.0, None]


def run(goodputs, refused=0, settled=None, ttfb=0.5, ttft=250.0):
    return {
        "clients": [{"goodput": g, "ttfb_p99_s": ttfb, "limited": 0, "failed": 0, "requests": 1, "failures": {}}
                    for g in goodputs],
        "provider": br.provider_stats([{"calls": 100, "ok": 100 - refused, "429": refused, "529": 0,
                                        "most_running": 0, "most_queued": 0, "ttft_ms": [ttft]}] * len(goodputs)),
        "seconds": [s for _, s in PHASES],
        "settled": settled,
    }


def test_targets_against_the_best_static_in_hindsight():
    results = {
        "none": run([20, 2, 20], refused=60),
        "static-8": run([8, 8, 8]),
        "static-32": run([30, 3, 30], refused=10),
        "adaptive": run([29, 7.5, 29], refused=2, settled=[3.0, 5.0, 8.0], ttfb=0.5),
    }
    assert br.best_static(results) == "static-32"
    v = br.verdicts(results, PHASES)
    assert all(ok for ok, _ in v), v
    # Missed: too little goodput in a phase, too many refusals, a limit that never settled.
    results["adaptive"] = run([20, 7.5, 29], refused=6, settled=[3.0, None, 8.0])
    missed = [what for ok, what in br.verdicts(results, PHASES) if not ok]
    assert len(missed) == 3, missed
    results["adaptive"] = run([29, 7.5, 29], refused=2, settled=[3.0, 5.0, 8.0], ttft=900.0)
    slow = [what for ok, what in br.verdicts(results, PHASES) if not ok]
    assert len(slow) == 3 and all("time to first token" in w for w in slow), slow
    assert "phase 1: goodput" in missed[0] and "429/529" in missed[1] and "never" in missed[2]
    assert "adaptive" in br.table(results, PHASES)
