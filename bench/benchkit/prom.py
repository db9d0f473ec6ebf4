"""rebound's /metrics (the Prometheus text format): reading it, and the change between two readings."""

import re

from .net import http_request
from .common import HOST, BenchError

# `name{label="value",...} number` or `name number` (an optional timestamp after the number)
SAMPLE = re.compile(r'^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prom(text):
    """The samples of a /metrics text as {(name, ((label, value), ...) sorted): float}; comments
    (# HELP, # TYPE) and blank lines skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        pairs = tuple(sorted((k, re.sub(r"\\(.)", r"\1", x)) for k, x in LABEL.findall(labels or "")))
        out[(name, pairs)] = v
    return out


def prom_sum(samples, name, **labels):
    """The sum of `name`'s samples whose labels include `labels` (0.0 when there is none)."""
    want = set(labels.items())
    return sum(v for (n, pairs), v in samples.items() if n == name and want <= set(pairs))


def prom_by(samples, name, label):
    """{value of `label`: the sum of `name`'s samples with it}."""
    out = {}
    for (n, pairs), v in samples.items():
        if n == name:
            for k, x in pairs:
                if k == label:
                    out[x] = out.get(x, 0.0) + v
    return out


def prom_delta(before, after):
    """after - before for every sample of `after` (a sample missing before counts from 0)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def read_metrics(admin_port):
    """GET /metrics on 127.0.0.1:`admin_port`, parsed (parse_prom)."""
    status, body = http_request("GET", f"http://{HOST}:{admin_port}/metrics", timeout=5.0)
    if status != 200:
        raise BenchError(f"GET /metrics on admin port {admin_port}: status {status}")
    return parse_prom(body.decode(errors="replace"))
