"""The Lua scripts wrk runs: every request's shape, and done(), which prints wrk's summary as one
JSON line (`WRKJSON {...}`) for loadgen.parse_wrk. They are str.format templates ({key}: the
phase's x-fake-key; literal braces doubled); cache_lua and body_lua fill the other fields first."""

import zlib

# wrk's summary as one JSON line (`WRKJSON {...}`), appended to every script below.
WRK_DONE = """\
function done(summary, latency, requests)
  io.write(string.format(
    'WRKJSON {{"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d}}\\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""

WRK_LUA = """\
wrk.method = "POST"
wrk.body = "{{}}"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-fake-key"] = "{key}"
""" + WRK_DONE


# Every request carries a fresh Idempotency-Key (so every one is claimed, forwarded and its
# response stored). After `limit` responses the thread stops sending and prints LIMIT; wrk itself
# would then sleep out its -d, so the harness ends the phase there and stops wrk with SIGINT
# (wrk then prints its summary and runs done()).
WRK_IDEM_LUA = """\
wrk.method = "POST"
wrk.body = "{{}}"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-fake-key"] = "{key}"
local sent, answered, limit = 0, 0, {limit}
function request()
  sent = sent + 1
  wrk.headers["Idempotency-Key"] = "{key}-" .. sent
  return wrk.format()
end
function response(status, headers, body)
  answered = answered + 1
  if answered == limit then
    io.write("LIMIT\\n")
    io.flush()
    wrk.thread:stop()
  end
end
function done(summary, latency, requests)
  io.write(string.format(
    'WRKJSON {{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p99_us":%d}}\\n',
    summary.requests, summary.duration, summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout, latency:percentile(50), latency:percentile(99)))
end
"""


# wrk's request(): every request gets its own Idempotency-Key (the phase's key, the wrk thread's
# number and a count, so never seen before). response() counts what the harness checks: non-2xx
# answers, and answers whose x-rebound-attempts is not 1 (a retry, which the fake provider never
# causes). done() reads the thread's counters: `sent` (requests written, with the up to -c requests
# in flight when wrk stops and abandons them) and `answered` (responses read).
WRK_KEYED_LUA = """\
wrk.method = "POST"
wrk.body = "{{}}"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-fake-key"] = "{key}"
sent, answered, non2xx, attempts_other, attempts_missing = 0, 0, 0, 0, 0
tid = 0
local threads = {{}}
function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end
function request()
  sent = sent + 1
  wrk.headers["Idempotency-Key"] = "{key}-" .. tid .. "-" .. sent
  return wrk.format()
end
function response(status, headers, body)
  answered = answered + 1
  if status < 200 or status > 299 then non2xx = non2xx + 1 end
  local a = headers["x-rebound-attempts"]
  if a == nil then attempts_missing = attempts_missing + 1
  elseif a ~= "1" then attempts_other = attempts_other + 1 end
end
function done(summary, latency, requests)
  local s, a, n, o, m = 0, 0, 0, 0, 0
  for _, t in ipairs(threads) do
    s = s + t:get("sent"); a = a + t:get("answered"); n = n + t:get("non2xx")
    o = o + t:get("attempts_other"); m = m + t:get("attempts_missing")
  end
  io.write(string.format(
    'WRKJSON {{"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d,"sent":%d,"answered":%d,"non2xx":%d,' ..
    '"attempts_other":%d,"attempts_missing":%d}}\\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), s, a, n, o, m))
end
"""


# The limits mode: every request `POST {"model":"gpt-fake","max_tokens":256}` with `x-team` one of
# LIMITS_TEAMS in turn (a bucket each under `key = "header:x-team"`). response() counts what the
# harness checks: answers that are not 2xx, 429s (a limit that refused or let a request wait past
# its time: the mode fails on one), and answers that carry the `RateLimit` field (every answer of a
# limited route: proof that the limit was applied; none of the plain route). done() as in
# WRK_KEYED_LUA.
WRK_LIMITS_LUA = """\
wrk.method = "POST"
wrk.body = '{{"model":"gpt-fake","max_tokens":256}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-fake-key"] = "{key}"
sent, answered, non2xx, s429, ratelimit = 0, 0, 0, 0, 0
tid = 0
local teams = {{{teams}}}
local threads = {{}}
function setup(thread)
  table.insert(threads, thread)
  thread:set("tid", #threads)
end
function request()
  sent = sent + 1
  wrk.headers["x-team"] = teams[sent % #teams + 1]
  return wrk.format()
end
function response(status, headers, body)
  answered = answered + 1
  if status < 200 or status > 299 then non2xx = non2xx + 1 end
  if status == 429 then s429 = s429 + 1 end
  if headers["ratelimit"] ~= nil then ratelimit = ratelimit + 1 end
end
function done(summary, latency, requests)
  local s, a, n, t, r = 0, 0, 0, 0, 0
  for _, th in ipairs(threads) do
    s = s + th:get("sent"); a = a + th:get("answered"); n = n + th:get("non2xx")
    t = t + th:get("s429"); r = r + th:get("ratelimit")
  end
  io.write(string.format(
    'WRKJSON {{"requests":%d,"duration_us":%d,"bytes":%d,"connect":%d,"read":%d,"write":%d,' ..
    '"status":%d,"timeout":%d,"p50_us":%d,"p99_us":%d,"sent":%d,"answered":%d,"non2xx":%d,' ..
    '"s429":%d,"ratelimit":%d}}\\n',
    summary.requests, summary.duration, summary.bytes, summary.errors.connect, summary.errors.read,
    summary.errors.write, summary.errors.status, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), s, a, n, t, r))
end
"""

# The cache mode's mix: with probability {ratio} one of {hot} hot requests, else one never seen.
WRK_CACHE_LUA = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-fake-key"] = "{key}"
math.randomseed({seed})
local n = 0
function request()
  n = n + 1
  local body
  if math.random() < {ratio} then
    body = '{{"model":"m","hot":' .. (n % {hot}) .. '}}'
  else
    body = '{{"model":"m","cold":"{key}-' .. n .. '"}}'
  end
  return wrk.format(nil, nil, nil, body)
end
""" + WRK_DONE


WRK_BODY_LUA = """\
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-fake-key"] = "{key}"
wrk.body = '{{"model":"m","input":"' .. string.rep("x", {fill}) .. '"}}'
local keyed, n = {keyed}, 0
function request()
  if keyed then
    n = n + 1
    wrk.headers["Idempotency-Key"] = "{key}-" .. n
  end
  return wrk.format()
end
""" + WRK_DONE

# --body-shape chat: the body as agents send it, a conversation of short messages with escapes
# (JSON's \" and \n) in every one, instead of one long string.
WRK_BODY_LUA_CHAT = WRK_BODY_LUA.replace(
    """wrk.body = '{{"model":"m","input":"' .. string.rep("x", {fill}) .. '"}}'""",
    """local item = [[{{"role":"user","content":"Line of the ticket: the customer said \\"it broke\\".\\nSummarise the log in one line.\\n"}}]]
local items = {{}}
for i = 1, math.max(1, math.floor(({fill}) / (#item + 1))) do items[i] = item end
wrk.body = '{{"model":"m","messages":[' .. table.concat(items, ",") .. ']}}'""")


def cache_lua(tag, ratio, hot):
    """WRK_CACHE_LUA for one phase: its random generator seeded from the phase's tag."""
    return WRK_CACHE_LUA.replace("{seed}", str(zlib.crc32(tag.encode()))).replace("{ratio}", str(ratio)) \
        .replace("{hot}", str(hot))


def body_lua(shape, nbytes, keyed):
    """The body mode's script: a body of about `nbytes` ("string": one long string; "chat": a
    conversation), with a fresh Idempotency-Key per request when `keyed`."""
    template = WRK_BODY_LUA_CHAT if shape == "chat" else WRK_BODY_LUA
    return template.replace("{fill}", str(nbytes - 26)).replace("{keyed}", "true" if keyed else "false")


def limits_lua(teams):
    """The limits mode's script (a str.format template still: {key} is the phase's x-fake-key),
    cycling `x-team` through `teams`."""
    return WRK_LIMITS_LUA.replace("{teams}", ", ".join(f'"{t}"' for t in teams))
