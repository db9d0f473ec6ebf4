-- circuit_lib_v1: helpers prepended to every circuit script. One upstream's keys, all under the
-- hash tag {upstream} (one cluster slot), always passed in this order:
--   KEYS[1] gen     fleet generation, no TTL: max(previous + 1, Redis time in ms) at every transition
--   KEYS[2] open    exists while the fleet circuit is open; its PX is the open time left
--   KEYS[3] trip    exists from an opening until the closing (open, then half-open); value: openings
--                   in a row (the doubling exponent); PX: open time + max_open_for
--   KEYS[4] probes  zset of half-open probe leases: member = token, score = lease end (Redis ms)
--   KEYS[5] oks     probe successes in this half-open phase
--   KEYS[6] win     fleet window: fields s<epoch> and f<epoch> (bucket counts, epoch = Redis ms /
--                   bucket ms) and cf (the fleet's run of consecutive failures); PX 2 * window
--   KEYS[7] cool    cooldowns: field = credential hash, value = end (Redis ms); PX the longest
-- Times are Redis's own (TIME) or relative (PX, ms left): replica clocks never meet.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function current_gen()
  return tonumber(redis.call('GET', KEYS[1]) or '0')
end

local function bump_gen(now)
  local g = current_gen()
  if g < now then g = now else g = g + 1 end
  redis.call('SET', KEYS[1], g)
  return g
end

-- The same formula as breaker::open_duration_with: min(max, base * 2^level), plus
-- jitter_ppm / 1e6 of a tenth of it, at most max, at least the (capped) Retry-After floor.
local function open_ms(level, base, max, jitter_ppm, floor)
  local d = max
  if level < 40 then
    d = base * (2 ^ level)
    if d > max then d = max end
  end
  d = math.floor(d)
  d = d + math.floor(math.floor(d / 10) * jitter_ppm / 1000000)
  if d > max then d = max end
  if d < floor then d = floor end
  if d < 1 then d = 1 end
  return d
end

local function open_circuit(now, level, base, max, jitter_ppm, floor, channel, upstream)
  local d = open_ms(level, base, max, jitter_ppm, floor)
  local g = bump_gen(now)
  redis.call('SET', KEYS[2], g, 'PX', d)
  redis.call('SET', KEYS[3], level, 'PX', d + max)
  redis.call('DEL', KEYS[4], KEYS[5], KEYS[6])
  redis.call('PUBLISH', channel, cjson.encode({k = 'open', u = upstream, ms = d, g = g}))
  return d
end

local function close_circuit(now, channel, upstream)
  local g = bump_gen(now)
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
  redis.call('PUBLISH', channel, cjson.encode({k = 'close', u = upstream, g = g}))
end

-- The fleet's state: s = 0 closed, 1 half-open, 2 open; ms = open time left; g = generation.
local function state()
  local g = current_gen()
  local pt = redis.call('PTTL', KEYS[2])
  if pt > 0 then return {s = 2, ms = pt, g = g} end
  if redis.call('EXISTS', KEYS[3]) == 1 then return {s = 1, ms = 0, g = g} end
  return {s = 0, ms = 0, g = g}
end
