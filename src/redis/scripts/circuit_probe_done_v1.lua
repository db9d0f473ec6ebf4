-- circuit_probe_done_v1: a leased probe's result. Only a lease still held counts (a lapsed or
-- stale one is ignored): half_open_probes successes close the fleet circuit, one failure opens it
-- again for twice as long; release just gives the lease back.
-- KEYS: see circuit_lib_v1.
-- ARGV: 1 token, 2 ok | fail | release, 3 half_open_probes, 4 open_for (ms), 5 max_open_for (ms),
--   6 jitter (ppm), 7 Retry-After floor (ms), 8 channel, 9 upstream.
-- Returns JSON {s, ms, g}: the fleet state after it.
local now = now_ms()
if redis.call('ZREM', KEYS[4], ARGV[1]) == 1 and redis.call('EXISTS', KEYS[3]) == 1
    and redis.call('EXISTS', KEYS[2]) == 0 then
  if ARGV[2] == 'ok' then
    local oks = redis.call('INCR', KEYS[5])
    redis.call('PEXPIRE', KEYS[5], math.max(redis.call('PTTL', KEYS[3]), 1))
    if oks >= tonumber(ARGV[3]) then close_circuit(now, ARGV[8], ARGV[9]) end
  elseif ARGV[2] == 'fail' then
    local level = tonumber(redis.call('GET', KEYS[3]) or '0') + 1
    open_circuit(now, level, tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]),
      ARGV[8], ARGV[9])
  end
end
return cjson.encode(state())
