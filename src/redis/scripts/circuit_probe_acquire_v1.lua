-- circuit_probe_acquire_v1: a half-open probe lease for one replica, so that the whole fleet has
-- at most half_open_probes probes out (leases held + probe successes so far).
-- KEYS: see circuit_lib_v1. ARGV: 1 token, 2 lease (ms), 3 half_open_probes.
-- Returns JSON {r = granted | busy | open | closed, s, ms, g}; ms is the lease for granted.
local now = now_ms()
local st = state()
if st.s ~= 1 then
  if st.s == 2 then st.r = 'open' else st.r = 'closed' end
  return cjson.encode(st)
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local held = redis.call('ZCARD', KEYS[4])
local oks = tonumber(redis.call('GET', KEYS[5]) or '0')
if held + oks < tonumber(ARGV[3]) then
  local lease = tonumber(ARGV[2])
  redis.call('ZADD', KEYS[4], now + lease, ARGV[1])
  if redis.call('PTTL', KEYS[4]) < lease then redis.call('PEXPIRE', KEYS[4], lease) end
  st.r = 'granted'
  st.ms = lease
else
  st.r = 'busy'
end
return cjson.encode(st)
