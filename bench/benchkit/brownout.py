"""The brownout mode: does an adaptive `concurrency` pay? Three rebound replicas on one Redis in
front of a provider whose capacity changes (brownout_provider.py: 32 concurrent requests, then 8
for a minute, then 32), clients offering twice the first capacity, in turn with no limit, each
fixed `concurrency` of --brownout-statics, and `concurrency = "adaptive"`. brownout_report.py turns
the records into numbers and checks issue 62's targets."""

import asyncio
import json
import sys
import time

from .brownout_provider import parse_phases
from .brownout_report import client_stats, provider_stats, settle_times, table, verdicts
from .common import BENCH, FLEET_REPLICAS, HOST, LOAD_CPU, BenchError, log
from .fleet import ReboundReplica, fleet_config_text, log_problems, start_fleet_redis
from .net import free_ports, http_request
from .procs import wait_until
from .results import append_result, now_ts

BROWNOUT_CONFIG = BENCH / "rebound.brownout.bench.toml"
PROVIDER = BENCH / "benchkit" / "brownout_provider.py"
PROVIDER_PORT = 19010  # the config's upstream
SERVICE_S = 1.0  # a stream's length at the provider (200 ms to the first token, then 7 x 100 ms)
DEADLINE_MS = 10_000  # each request's x-rebound-deadline-ms: the longest it waits in a queue
LIMIT_SERIES = 'rebound_concurrency_limit{model="other",upstream="fake"}'
IN_FLIGHT_SERIES = 'rebound_concurrency_in_flight{model="other",upstream="fake"}'


def config_text(index, redis_table, mode):
    """The mode's config for replica `index`: `mode` is "none", "adaptive" or a fixed number."""
    text = BROWNOUT_CONFIG.read_text()
    url = f'url = "http://{HOST}:{PROVIDER_PORT}"'
    if url not in text:
        raise BenchError(f"{BROWNOUT_CONFIG} has no '{url}'")
    if mode == "adaptive":
        text = text.replace(url, url + '\nconcurrency = "adaptive"') + "\n[concurrency]\ninitial = 20\n"
    elif mode != "none":
        text = text.replace(url, url + f"\nconcurrency = {int(mode)}")
    return fleet_config_text(text, index, redis_table, source=BROWNOUT_CONFIG, mode="brownout",
                             what=f"concurrency {mode}")


async def one_request(port, t0, records):
    """One streamed chat request to the replica on `port`: (start s, status, time to first body
    byte s, whole stream, x-rebound-error, end s) appended to `records`."""
    start = time.monotonic() - t0
    status, ttfb, whole, error = 0, None, False, ""
    body = b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}'
    req = (f"POST /fake/v1/chat/completions HTTP/1.1\r\nhost: {HOST}:{port}\r\ncontent-type: application/json\r\n"
           f"x-rebound-deadline-ms: {DEADLINE_MS}\r\nconnection: close\r\ncontent-length: {len(body)}\r\n\r\n"
           ).encode() + body
    writer = None
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
        writer.write(req)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "x-rebound-error":
                error = value.strip()
        first = await reader.read(1)
        ttfb = time.monotonic() - t0 - start
        rest = await reader.read()
        whole = b"[DONE]" in first + rest
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
        pass
    finally:
        if writer is not None:
            writer.close()
    records.append((start, status, ttfb, whole, error, time.monotonic() - t0))


async def sample_limits(admins, t0, until, samples):
    """Every 0.5 s until `until`: (s, the fleet's limit (the highest a replica reports), the fleet's
    requests in flight under it (summed))."""
    loop = asyncio.get_running_loop()
    while time.monotonic() < until:
        limits, in_flight = [], 0.0
        for admin in admins:
            status, body = await loop.run_in_executor(None, http_request, "GET", f"http://{HOST}:{admin}/metrics")
            for line in body.decode(errors="replace").splitlines() if status == 200 else []:
                if line.startswith(LIMIT_SERIES + " "):
                    limits.append(float(line.split()[-1]))
                elif line.startswith(IN_FLIGHT_SERIES + " "):
                    in_flight += float(line.split()[-1])
        if limits:
            samples.append((time.monotonic() - t0, max(limits), in_flight))
        await asyncio.sleep(0.5)


async def offer(ports, admins, rate, seconds, sample):
    """Requests at `rate` per second for `seconds`, spread over `ports` in turn, each waited for to
    its end; the limit sampled meanwhile when `sample`. Returns (records, samples)."""
    records, samples, tasks = [], [], []
    t0 = time.monotonic()
    sampler = asyncio.create_task(sample_limits(admins, t0, t0 + seconds, samples)) if sample else None
    n = 0
    while True:
        at = t0 + n / rate
        if at - t0 >= seconds:
            break
        delay = at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one_request(ports[n % len(ports)], t0, records)))
        n += 1
    await asyncio.wait(tasks, timeout=DEADLINE_MS / 1000 + 30)
    if sampler is not None:
        await sampler
    return records, samples


def start_provider(procs, d, phases):
    argv = [sys.executable, PROVIDER, "--port", PROVIDER_PORT,
            "--phases", ",".join(f"{c}:{s:g}" for c, s in phases)]
    p = procs.spawn("brownout-provider", argv, LOAD_CPU, logfile=d / "provider.log")
    wait_until("the brownout provider", lambda: http_request(
        "GET", f"http://{HOST}:{PROVIDER_PORT}/_brownout/stats")[0] == 200, p)
    return p


def measure(args, procs, tmp, mode, phases):
    """One configuration on a fresh Redis, provider and replicas: the load over every phase."""
    d = tmp / f"brownout-{mode}"
    d.mkdir()
    redis, _, table_text = start_fleet_redis(procs, d, "single")
    provider = start_provider(procs, d, phases)
    replicas = []
    try:
        for i in range(len(FLEET_REPLICAS)):
            path = d / f"rebound-{i}.toml"
            path.write_text(config_text(i, table_text, mode))
            replicas.append(ReboundReplica(procs, d, i, path))
            replicas[-1].start()
        http_request("POST", f"http://{HOST}:{PROVIDER_PORT}/_brownout/start")
        seconds = sum(s for _, s in phases)
        rate = args.brownout_rate or 2 * phases[0][0] / SERVICE_S
        log(f"  {mode}: {rate:g} requests/s for {seconds:g} s over {len(replicas)} replicas, "
            f"capacity {' -> '.join(str(c) for c, _ in phases)}")
        ports = [port for port, _ in FLEET_REPLICAS]
        admins = [admin for _, admin in FLEET_REPLICAS]
        records, samples = asyncio.run(offer(ports, admins, rate, seconds, mode == "adaptive"))
        status, body = http_request("GET", f"http://{HOST}:{PROVIDER_PORT}/_brownout/stats")
        if status != 200:
            raise BenchError("the brownout provider did not answer its stats")
        stats = json.loads(body)
    finally:
        for r in replicas:
            r.stop()
        procs.stop(provider)
        for p in redis:
            procs.stop(p)
    warnings = [f"{mode}: {r.log_name}: {len(lines)} WARN/ERROR line(s), first: {lines[0][:200]}"
                for r in replicas for lines in [log_problems(d / r.log_name)] if lines]
    return {
        "clients": client_stats(records, phases),
        "provider": provider_stats(stats),
        "seconds": [s for _, s in phases],
        "settled": settle_times([(t, v) for t, v, _ in samples], phases) if mode == "adaptive" else None,
        "limit_samples": samples,
    }, warnings


def brownout_main(args, procs, tmp, info):
    """No limit, each fixed limit, adaptive: one configuration at a time, fresh each."""
    phases = parse_phases(args.brownout_phases)
    free = free_ports(PROVIDER_PORT, 1)
    if free != [PROVIDER_PORT]:
        raise BenchError(f"port {PROVIDER_PORT} (the brownout provider) is in use")
    modes = ["none"] + [str(n) for n in args.brownout_statics] + ["adaptive"]
    results, warnings = {}, []
    for mode in modes:
        name = {"none": "none", "adaptive": "adaptive"}.get(mode, f"static-{mode}")
        results[name], warn = measure(args, procs, tmp, mode, phases)
        warnings += warn
        if args.results:
            metrics = {k: v for k, v in results[name].items() if k != "limit_samples"}
            append_result(args.results, info.record(ts=now_ts(), run=1, runs=1, mode="brownout", target=name,
                                                    url=[], metrics=metrics))
    print(info.headline(f"3 rebound replicas on one Redis, a provider of capacity "
                        f"{' -> '.join(f'{c} ({s:g} s)' for c, s in phases)}, clients at "
                        f"{args.brownout_rate or 2 * phases[0][0] / SERVICE_S:g} requests/s"), flush=True)
    print(table(results, phases), flush=True)
    print("\nissue 62's targets (adaptive against the best fixed limit in hindsight):", flush=True)
    for ok, what in verdicts(results, phases):
        print(f"  {'met ' if ok else 'MISSED'} {what}", flush=True)
    adaptive = results.get("adaptive")
    if adaptive:
        trace = " ".join(f"{t:.0f}s:{v:g}/{n:g}" for t, v, n in adaptive["limit_samples"][::4])
        print(f"\nthe adaptive limit / the fleet's requests in flight under it, every 2 s: {trace}", flush=True)
    for w in warnings:
        print(f"WARNING: {w}", flush=True)
