-- limit_queue_v1: the fleet's queue of one bucket: the requests that wait for a limit
-- (on_limit = "queue") on every replica, released in start-time fair order across share values
-- (as crate::limits::fair_queue does on one replica), first in, first out within a value.
-- KEYS[1] the queue ({prefix}limit:{NAME:BUCKET}:queue), a sorted set: member -> start tag.
-- KEYS[2] the deadlines ({prefix}limit:{NAME:BUCKET}:deadlines), a sorted set: member -> unix ms.
-- KEYS[3] the books ({prefix}limit:{NAME:BUCKET}:books), a hash: "v" -> the virtual time,
--         "f:SHARE" -> the share's last finish tag, "r:REPLICA" -> until when the replica is live.
-- ARGV: 1 op (join | head | done | served), 2 replica id, 3 ticket, 4 ttl ms, 5 liveness ms;
--       join: 6 share, 7 weight, 8 deadline (unix ms).
-- A member is "REPLICA:TICKET". Every call renews the caller's liveness; entries past their
-- deadline, or of a replica no longer live (it died waiting), are dropped first.
-- Returns {join: the start tag; head: the member's rank (-1: not queued); done: -1, queue length}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, replica, ttl = ARGV[1], ARGV[2], tonumber(ARGV[4])
local member = replica .. ':' .. ARGV[3]
redis.call('HSET', KEYS[3], 'r:' .. replica, now + tonumber(ARGV[5]))
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, m in ipairs(expired) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
end
while true do
  local first = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if not first then break end
  local owner = string.match(first, '^([^:]+):')
  if tonumber(redis.call('HGET', KEYS[3], 'r:' .. (owner or '')) or '0') >= now then break end
  redis.call('ZREM', KEYS[1], first)
  redis.call('ZREM', KEYS[2], first)
end
local result = -1
if op == 'join' then
  local v = tonumber(redis.call('HGET', KEYS[3], 'v') or '0')
  local share = 'f:' .. ARGV[6]
  local start = math.max(v, tonumber(redis.call('HGET', KEYS[3], share) or '0'))
  redis.call('HSET', KEYS[3], share, start + math.floor(1048576 / math.max(1, tonumber(ARGV[7]))))
  redis.call('ZADD', KEYS[1], start, member)
  redis.call('ZADD', KEYS[2], ARGV[8], member)
  result = start
elseif op == 'head' then
  result = redis.call('ZRANK', KEYS[1], member) or -1
else
  local tag = redis.call('ZSCORE', KEYS[1], member)
  redis.call('ZREM', KEYS[1], member)
  redis.call('ZREM', KEYS[2], member)
  if op == 'served' and tag then
    local v = tonumber(redis.call('HGET', KEYS[3], 'v') or '0')
    if tonumber(tag) > v then redis.call('HSET', KEYS[3], 'v', tag) end
  end
end
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
return {result, redis.call('ZCARD', KEYS[1])}
