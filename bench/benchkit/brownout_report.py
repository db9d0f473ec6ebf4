"""The brownout mode's numbers, from what it recorded (pure: tested in bench/tests/test_brownout.py).

Per configuration and phase: the goodput (whole streams per second, by when they ended: what the
phase delivered), the p99 time to first byte the clients saw of the requests answered 200 (a wait
in rebound's queue included), the requests rebound refused (429 `concurrency_limited`) and those
that failed otherwise (by when they started); the provider's calls, the share it answered 429 or
529, and the p99 time to first token of the requests it served (its own queue included: how far
over its capacity it was pushed). For the adaptive configuration, how long its limit took to settle within 25%
of each phase's capacity, and the targets of issue 62 checked."""

import math

# Within this share of the capacity, the limit has settled.
SETTLE_BAND = 0.25
# ...and it must have within this long of each change.
SETTLE_WITHIN_S = 10.0
# Adaptive keeps at least this share of the best static limit's goodput in every phase.
GOODPUT_SHARE = 0.9
# At most this share of the provider's calls answered 429 or 529.
REFUSED_SHARE = 0.05


def percentile(values, q):
    """The nearest-rank `q`th percentile of `values` (not empty)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def phase_of(t, phases):
    """The index of the phase `t` seconds after the start falls in (None: outside)."""
    start = 0.0
    for i, (_, seconds) in enumerate(phases):
        if start <= t < start + seconds:
            return i
        start += seconds
    return None


def phase_starts(phases):
    starts, t = [], 0.0
    for _, seconds in phases:
        starts.append(t)
        t += seconds
    return starts


def client_stats(records, phases):
    """Per phase, from the clients' records (start s, status, ttfb s or None, whole, error, end s):
    requests started, whole streams ended per second, the p99 time to first byte of those answered
    200, rebound's 429s, other failures."""
    out = []
    for i, (_, seconds) in enumerate(phases):
        mine = [r for r in records if phase_of(r[0], phases) == i]
        ok = [r for r in records if r[1] == 200 and r[3] and phase_of(r[5], phases) == i]
        ttfbs = [r[2] for r in mine if r[1] == 200 and r[2] is not None]
        out.append({
            "requests": len(mine),
            "goodput": len(ok) / seconds,
            "ttfb_p99_s": percentile(ttfbs, 99) if ttfbs else None,
            "limited": sum(1 for r in mine if r[1] == 429 and r[4] == "concurrency_limited"),
            "failed": sum(1 for r in mine if not (r[1] == 200 and r[3])),
            "failures": failures(mine),
        })
    return out


def failures(records):
    """The failed requests by what they got: `429 concurrency_limited`, `529`, `200 cut` (a stream
    that did not end whole), `0` (no answer)."""
    out = {}
    for r in records:
        if r[1] == 200 and r[3]:
            continue
        what = "200 cut" if r[1] == 200 else f"{r[1]} {r[4]}".strip()
        out[what] = out.get(what, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def provider_stats(stats):
    """The provider's per phase counts, with the share of its calls it refused (429 or 529)."""
    out = []
    for st in stats:
        refused = st["429"] + st["529"]
        ttft = st.get("ttft_ms") or []
        row = {k: v for k, v in st.items() if k != "ttft_ms"}
        out.append(dict(row, refused=refused, refused_share=refused / st["calls"] if st["calls"] else 0.0,
                        ttft_p99_ms=percentile(ttft, 99) if ttft else None))
    return out


def settle_times(samples, phases):
    """For each phase, the seconds from its start until the limit (samples: (t s, limit)) entered the
    band of its capacity and stayed there to the phase's end; None when it never did."""
    out = []
    starts = phase_starts(phases)
    for i, (capacity, seconds) in enumerate(phases):
        lo, hi = capacity * (1 - SETTLE_BAND), capacity * (1 + SETTLE_BAND)
        mine = [(t, v) for t, v in samples if starts[i] <= t < starts[i] + seconds]
        settled = None
        for t, v in mine:
            if lo <= v <= hi:
                if settled is None:
                    settled = t - starts[i]
            else:
                settled = None
        out.append(settled)
    return out


def best_static(results):
    """The static configuration with the most whole streams over the whole run (None: none ran)."""
    statics = [(sum(p["goodput"] * s for p, s in zip(r["clients"], r["seconds"])), name)
               for name, r in results.items() if name.startswith("static-")]
    return max(statics)[1] if statics else None


def verdicts(results, phases):
    """Issue 62's targets for the adaptive configuration, each (met, what it says)."""
    adaptive = results.get("adaptive")
    best = best_static(results)
    if adaptive is None or best is None:
        return []
    out = []
    for i, (mine, theirs) in enumerate(zip(adaptive["clients"], results[best]["clients"])):
        share = mine["goodput"] / theirs["goodput"] if theirs["goodput"] else 1.0
        out.append((share >= GOODPUT_SHARE,
                    f"phase {i + 1}: goodput {mine['goodput']:.1f}/s, {share:.0%} of {best}'s "
                    f"{theirs['goodput']:.1f}/s (target {GOODPUT_SHARE:.0%})"))
    calls = sum(p["calls"] for p in adaptive["provider"])
    refused = sum(p["refused"] for p in adaptive["provider"])
    share = refused / calls if calls else 0.0
    out.append((share <= REFUSED_SHARE,
                f"provider calls answered 429/529: {share:.1%} of {calls} (target at most {REFUSED_SHARE:.0%})"))
    for i, settled in enumerate(adaptive.get("settled") or []):
        if i == 0:
            continue  # the first phase starts from `initial`, not from a change
        ok = settled is not None and settled <= SETTLE_WITHIN_S
        said = "never" if settled is None else f"{settled:.1f} s"
        out.append((ok, f"phase {i + 1}: the limit settled within {SETTLE_BAND:.0%} of {phases[i][0]} after {said} "
                        f"(target {SETTLE_WITHIN_S:.0f} s)"))
    for i, (mine, theirs) in enumerate(zip(adaptive["provider"], results[best]["provider"])):
        a, b = mine["ttft_p99_ms"], theirs["ttft_p99_ms"]
        if a is not None and b is not None:
            out.append((a <= b * 1.1 + 50,
                        f"phase {i + 1}: p99 time to first token of the requests the provider served "
                        f"{a:.0f} ms vs {best}'s {b:.0f} ms"))
    return out


def table(results, phases):
    """One line per configuration and phase."""
    head = (f"{'config':<12} {'phase':>5} {'cap':>4} {'goodput/s':>9} {'ttfb p99':>9} {'limited':>7} "
            f"{'failed':>6} {'prov calls':>10} {'429/529':>8} {'ttft p99':>9} {'settled':>7}")
    lines = [head, "-" * len(head)]
    for name, r in results.items():
        settled = r.get("settled") or [None] * len(phases)
        for i, (c, p) in enumerate(zip(r["clients"], r["provider"])):
            ttfb = "-" if c["ttfb_p99_s"] is None else f"{c['ttfb_p99_s'] * 1000:.0f} ms"
            s = "-" if settled[i] is None else f"{settled[i]:.1f} s"
            ttft = "-" if p.get("ttft_p99_ms") is None else f"{p['ttft_p99_ms']:.0f} ms"
            lines.append(f"{name:<12} {i + 1:>5} {phases[i][0]:>4} {c['goodput']:>9.1f} {ttfb:>9} {c['limited']:>7} "
                         f"{c['failed']:>6} {p['calls']:>10} {p['refused_share']:>8.1%} {ttft:>9} {s:>7}")
    lines.append("")
    for name, r in results.items():
        for i, c in enumerate(r["clients"]):
            if c["failures"]:
                shown = ", ".join(f"{k}: {v}" for k, v in c["failures"].items())
                lines.append(f"{name} phase {i + 1} failures: {shown}")
    return "\n".join(lines)
