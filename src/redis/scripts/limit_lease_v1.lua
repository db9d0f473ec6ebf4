-- limit_lease_v1: a share of one bucket's quota in one window, granted to one replica, which
-- spends it locally. The counter holds what the fleet was granted, never more than the limit.
-- The bucket's replicas are counted too (each lease renews the asker's entry): what a replica's
-- share is while Redis is away, and how large its leases should be.
-- KEYS[1] the window's counter ({prefix}limit:{NAME:BUCKET}:QUOTA:WINDOW).
-- KEYS[2] the bucket's replicas ({prefix}limit:{NAME:BUCKET}:replicas), a hash: id -> expiry ms.
-- KEYS[3] the bucket's fleet queue (limit_queue_v2.lua: its waiting set), read for its length only.
-- ARGV: 1 want, 2 limit, 3 ttl ms (until the window's end, plus a margin), 4 replica id,
-- 5 how long a replica counts after its last lease (ms).
-- Returns {granted, granted to the fleet so far, replicas, requests waiting in the fleet's queue}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], ARGV[4], now + tonumber(ARGV[5]))
local all = redis.call('HGETALL', KEYS[2])
local replicas = 0
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) <= now then redis.call('HDEL', KEYS[2], all[i]) else replicas = replicas + 1 end
end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local left = tonumber(ARGV[2]) - used
local waiting = redis.call('ZCARD', KEYS[3])
if left <= 0 then return {0, used, replicas, waiting} end
local grant = math.min(tonumber(ARGV[1]), left)
used = redis.call('INCRBY', KEYS[1], grant)
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return {grant, used, replicas, waiting}
