"""Per-request figures, and the median over runs."""

import statistics

# counts of failures: summed over runs, not medians
COUNT_KEYS = ("lost", "thr_errors", "thr_non2xx", "lat_errors", "lat_non2xx", "sse_incomplete", "sse_errors", "sse_non2xx",
              "policy_lost", "policy_errors", "policy_non2xx", "policy_attempts_not_1", "scale_lost", "scale_idle_failed",
              "scale_idle_closed_by_proxy", "scale_sse_lost", "limits_lost", "limits_errors", "limits_non2xx",
              "limits_429", "limits_queued", "limits_rejected", "limits_fleet_lost", "limits_fleet_errors",
              "limits_fleet_non2xx", "limits_fleet_429", "limits_fleet_queued", "limits_fleet_rejected")


def per(x, n, scale=1e6):
    """x / n * scale (by default seconds per item in microseconds); None without x or n."""
    return None if x is None or not n else x / n * scale


def ms(seconds):
    return None if seconds is None else seconds * 1000.0


def ratio(a, b):
    """a / b, None when a is None or b is None or 0."""
    return a / b if a is not None and b else None


def aggregate(per_run):
    """Median of each numeric metric over runs; failure counts are summed, noise indicators maxed."""
    out = {}
    keys = {k for m in per_run for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for k in keys:
        vals = [m[k] for m in per_run if isinstance(m.get(k), (int, float))]
        if not vals:
            continue
        if k in COUNT_KEYS or k.endswith("_mismatch"):
            out[k] = sum(vals)
        elif k.endswith("other_cpu_pct") or k.endswith("steal_pct"):
            out[k] = max(vals)
        else:
            out[k] = statistics.median(vals)
    return out
