-- concurrency_v1: one replica's exchange with the fleet about one scope of an upstream's
-- `concurrency` (a credential and model): it reports the requests it runs and wants, and what its
-- own answers did to the limit since its last exchange; it gets the fleet's limit and its part.
-- The limit is one number for the fleet: growth adds up (each replica adds what its successes
-- earned), a decrease takes the lowest limit a replica proposes (every replica sees the same
-- overload: the fleet decreases once, not once per replica). A replica's part is a lease: the
-- parts granted, or the requests a replica still runs where that is more, never add up to more
-- than the limit, so a part is what the fair share would be, less what the others hold. A replica
-- that stops reporting stops holding when its report expires.
-- KEYS[1] the scope, a hash: "limit" -> the limit (a number), "dec" -> decreases so far,
--   "r:" .. replica -> "running:wanted:part:expiry ms" (Redis time).
-- ARGV: 1 replica id, 2 running, 3 wanted (running + waiting), 4 initial, 5 min, 6 max,
--   7 growth since the last exchange, 8 the limit it lowered to (-1: none), 9 report ttl ms,
--   10 the scope's ttl ms (unused that long, it starts again from the initial limit).
-- Returns {its part (requests it may run), the limit (a string), decreases so far, replicas}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local min, max = tonumber(ARGV[5]), tonumber(ARGV[6])
local limit = tonumber(redis.call('HGET', KEYS[1], 'limit') or ARGV[4])
local dec = tonumber(redis.call('HGET', KEYS[1], 'dec') or '0')
local lowered = tonumber(ARGV[8])
if lowered >= 0 then
  if lowered < limit then
    limit = math.max(min, lowered)
    dec = dec + 1
  end
else
  limit = math.min(max, limit + tonumber(ARGV[7]))
end
limit = math.max(min, math.min(max, limit))
local me = 'r:' .. ARGV[1]
-- The live reports, this replica's new one among them.
local ids, running, wanted, part = {me}, {}, {}, {}
running[me], wanted[me], part[me] = tonumber(ARGV[2]), tonumber(ARGV[3]), 0
local total = wanted[me]
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f = all[i]
  if string.sub(f, 1, 2) == 'r:' and f ~= me then
    local r, w, p, expiry = string.match(all[i + 1], '^(%d+):(%d+):(%d+):(%d+)$')
    if r == nil or tonumber(expiry) <= now then
      redis.call('HDEL', KEYS[1], f)
    else
      table.insert(ids, f)
      running[f], wanted[f], part[f] = tonumber(r), tonumber(w), tonumber(p)
      total = total + wanted[f]
    end
  end
end
table.sort(ids)
-- The fair shares in whole requests: what each wants when the limit covers it all (and an even
-- share of what is left over), else a share in proportion to what each wants; the units rounding
-- leaves go by the largest remainder, then by id.
local whole = math.floor(limit)
local n = #ids
local fair, rest, given = {}, {}, 0
for _, id in ipairs(ids) do
  local exact
  if total <= whole then
    exact = wanted[id] + (whole - total) / n
  else
    exact = whole * wanted[id] / total
  end
  fair[id] = math.floor(exact)
  rest[id] = exact - fair[id]
  given = given + fair[id]
end
local order = {}
for i, id in ipairs(ids) do order[i] = id end
table.sort(order, function(a, b)
  if rest[a] ~= rest[b] then return rest[a] > rest[b] end
  return a < b
end)
local left = whole - given
for i = 1, n do
  if left <= 0 then break end
  fair[order[i]] = fair[order[i]] + 1
  left = left - 1
end
-- This replica's part: its fair share, within what the others hold.
local held = 0
for _, id in ipairs(ids) do
  if id ~= me then held = held + math.max(part[id], running[id]) end
end
local mine = math.max(0, math.min(fair[me], whole - held))
redis.call('HSET', KEYS[1], 'limit', tostring(limit), 'dec', dec,
  me, ARGV[2] .. ':' .. ARGV[3] .. ':' .. mine .. ':' .. (now + tonumber(ARGV[9])))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[10]))
return {mine, tostring(limit), dec, n}
