-- limit_queue_v2: the fleet's queue of one bucket: the requests that wait for a limit
-- (on_limit = "queue") on every replica, released in start-time fair order across share values
-- as crate::limits::fair_queue does on one replica: first in, first out within a value; only
-- each value's first entry has a start tag, max(the virtual time, the value's last finish),
-- given when it becomes first; serving it moves the virtual time to its tag and the value's
-- finish to tag + 2^20 / weight. An entry that leaves unserved (its wait ran out, its client
-- left, its replica died) charges its value nothing (v1 charged every join, and a value whose
-- requests gave up and came back starved).
-- KEYS[1] the waiting ({prefix}limit:{NAME:BUCKET}:waiting), a sorted set: member -> deadline
--         (unix ms), every entry (the lease and slot scripts read its length).
-- KEYS[2] the heads ({prefix}limit:{NAME:BUCKET}:ready), a sorted set: each value's first
--         member -> its start tag.
-- KEYS[3] the order ({prefix}limit:{NAME:BUCKET}:fifo), a sorted set of "SHARE|SEQ|MEMBER", all
--         at score 0: by value, then arrival.
-- KEYS[4] the books ({prefix}limit:{NAME:BUCKET}:books2), a hash: "v" the virtual time, "seq"
--         the arrivals, "f:SHARE" the value's last finish, "e:MEMBER" "SHARE|SEQ|WEIGHT",
--         "r:REPLICA" until when the replica is live.
-- ARGV: 1 op (join | head | done | served), 2 replica id, 3 ticket, 4 ttl ms, 5 liveness ms;
--       join: 6 share, 7 weight, 8 deadline (unix ms).
-- A member is "REPLICA:TICKET". Every call renews the caller's liveness; entries past their
-- deadline, and a first entry of a replica no longer live (it died waiting), are dropped first.
-- Returns {result, mine, waiting}: join: the entry's start tag as of now (its place among the
-- caller's own entries); head: 0 its turn, 1 not yet, -1 not queued; done, served: -1. `mine`:
-- on head, the ticket of the fleet's first entry when it is the caller's (else -1).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local W, R, F, B = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op, replica, ttl = ARGV[1], ARGV[2], tonumber(ARGV[4])
local member = replica .. ':' .. ARGV[3]
local UNIT = 1048576
redis.call('HSET', B, 'r:' .. replica, now + tonumber(ARGV[5]))

local function num(field)
  return tonumber(redis.call('HGET', B, field) or '0')
end

local function cost(weight)
  return math.floor(UNIT / math.max(1, tonumber(weight) or 1))
end

-- The first entry of `share` left: the next one, if any, gets its start tag.
local function promote(share)
  local nxt = redis.call('ZRANGEBYLEX', F, '[' .. share .. '|', '(' .. share .. '}', 'LIMIT', 0, 1)[1]
  if nxt then
    local m = string.match(nxt, '^[^|]*|[^|]*|(.*)$')
    redis.call('ZADD', R, math.max(num('v'), num('f:' .. share)), m)
  end
end

-- Takes `m` out of the queue; `served`: it was admitted, and its value's books move on.
local function remove(m, served)
  local info = redis.call('HGET', B, 'e:' .. m)
  if not info then return end
  local share, seq, weight = string.match(info, '^([^|]*)|([^|]*)|(.*)$')
  redis.call('HDEL', B, 'e:' .. m)
  redis.call('ZREM', W, m)
  redis.call('ZREM', F, share .. '|' .. seq .. '|' .. m)
  local tag = redis.call('ZSCORE', R, m)
  if tag then
    redis.call('ZREM', R, m)
  end
  if served then
    -- Served out of its turn (the fleet could not say): charged from where it would start.
    local start = tonumber(tag) or math.max(num('v'), num('f:' .. share))
    if start > num('v') then redis.call('HSET', B, 'v', start) end
    redis.call('HSET', B, 'f:' .. share, start + cost(weight))
  end
  if tag then promote(share) end
end

for _, m in ipairs(redis.call('ZRANGEBYSCORE', W, '-inf', now)) do
  remove(m, false)
end
while true do
  local first = redis.call('ZRANGE', R, 0, 0)[1]
  if not first then break end
  local owner = string.match(first, '^([^:]+):')
  if num('r:' .. (owner or '')) >= now then break end
  remove(first, false)
end

local result, mine = -1, -1
if op == 'join' then
  local share, weight = ARGV[6], tonumber(ARGV[7])
  remove(member, false)
  local seq = string.format('%016d', redis.call('HINCRBY', B, 'seq', 1))
  redis.call('HSET', B, 'e:' .. member, share .. '|' .. seq .. '|' .. weight)
  redis.call('ZADD', W, ARGV[8], member)
  redis.call('ZADD', F, 0, share .. '|' .. seq .. '|' .. member)
  local ahead = redis.call('ZLEXCOUNT', F, '[' .. share .. '|', '(' .. share .. '}') - 1
  local start = math.max(num('v'), num('f:' .. share))
  if ahead == 0 then
    redis.call('ZADD', R, start, member)
  end
  result = start + ahead * cost(weight)
elseif op == 'head' then
  if redis.call('HEXISTS', B, 'e:' .. member) == 1 then
    local first = redis.call('ZRANGE', R, 0, 0)[1]
    result = (first == member) and 0 or 1
    if first and string.match(first, '^([^:]+):') == replica then
      mine = tonumber(string.match(first, ':(%d+)$')) or -1
    end
  end
else
  remove(member, op == 'served')
end
local waiting = redis.call('ZCARD', W)
if waiting == 0 then
  -- Nobody waits: nobody is owed anything (the replicas' liveness stays).
  for _, f in ipairs(redis.call('HKEYS', B)) do
    if f == 'v' or string.sub(f, 1, 2) == 'f:' then redis.call('HDEL', B, f) end
  end
end
for i = 1, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
return {result, mine, waiting}
