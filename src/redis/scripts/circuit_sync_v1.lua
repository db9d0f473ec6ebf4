-- circuit_sync_v1: one replica's periodic exchange for one upstream, in one round trip.
-- Adds the replica's outcome counts to the fleet window (not while the circuit is tripped), opens
-- the fleet circuit when the fleet crosses a threshold, and returns the fleet state and the
-- cooldowns in force. The fleet opens when failures are at least failure_rate of its window and
-- either the window holds minimum_requests calls or the fleet's run of failures reached
-- consecutive_failures (so one replica's bad path cannot open it while the others succeed).
-- KEYS: see circuit_lib_v1.
-- ARGV: 1 successes, 2 failures, 3 failures after the last success, 4 had a success (0/1),
--   5 Retry-After floor (ms), 6 bucket (ms), 7 buckets, 8 minimum_requests,
--   9 failure_rate (parts per million), 10 consecutive_failures, 11 open_for (ms),
--   12 max_open_for (ms), 13 jitter (ppm), 14 window (ms), 15 channel, 16 upstream,
--   17 has a shared breaker (0/1).
-- Returns JSON {s, ms, g, opened?, cool? = {hash: ms left}}.
local now = now_ms()
local out = {s = 0, ms = 0, g = 0}
if ARGV[17] == '1' then
  local s, f, tail = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  if (s > 0 or f > 0) and redis.call('EXISTS', KEYS[3]) == 0 then
    local ep = math.floor(now / tonumber(ARGV[6]))
    local nb = tonumber(ARGV[7])
    if s > 0 then redis.call('HINCRBY', KEYS[6], 's' .. ep, s) end
    if f > 0 then redis.call('HINCRBY', KEYS[6], 'f' .. ep, f) end
    local cf
    if ARGV[4] == '1' then
      cf = tail
      redis.call('HSET', KEYS[6], 'cf', cf)
    else
      cf = redis.call('HINCRBY', KEYS[6], 'cf', tail)
    end
    redis.call('PEXPIRE', KEYS[6], tonumber(ARGV[14]) * 2)
    local ts, tf = 0, 0
    local fields = redis.call('HGETALL', KEYS[6])
    for i = 1, #fields, 2 do
      local kind = string.sub(fields[i], 1, 1)
      if kind == 's' or kind == 'f' then
        local e = tonumber(string.sub(fields[i], 2))
        if e ~= nil and e > ep - nb and e <= ep then
          if kind == 's' then ts = ts + tonumber(fields[i + 1]) else tf = tf + tonumber(fields[i + 1]) end
        else
          redis.call('HDEL', KEYS[6], fields[i])
        end
      end
    end
    local total = ts + tf
    local rate = total > 0 and tf * 1000000 >= tonumber(ARGV[9]) * total
    if rate and (total >= tonumber(ARGV[8]) or cf >= tonumber(ARGV[10])) then
      open_circuit(now, 0, tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[5]),
        ARGV[15], ARGV[16])
      out.opened = 1
    end
  end
  local st = state()
  out.s, out.ms, out.g = st.s, st.ms, st.g
end
local cool, n = {}, 0
local fields = redis.call('HGETALL', KEYS[7])
for i = 1, #fields, 2 do
  local left = tonumber(fields[i + 1]) - now
  if left > 0 then
    cool[fields[i]] = left
    n = n + 1
  else
    redis.call('HDEL', KEYS[7], fields[i])
  end
end
if n > 0 then out.cool = cool end
return cjson.encode(out)
