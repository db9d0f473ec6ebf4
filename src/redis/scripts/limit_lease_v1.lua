-- limit_lease_v1: a share of one bucket's quota in one window, granted to one replica, which
-- spends it locally. The counter holds what the fleet was granted, never more than the limit.
-- KEYS[1] the window's counter ({prefix}limit:{NAME:BUCKET}:QUOTA:WINDOW).
-- ARGV: 1 want, 2 limit, 3 ttl ms (until the window's end, plus a margin).
-- Returns {granted, granted to the fleet so far}: less than wanted when the quota runs out.
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local left = tonumber(ARGV[2]) - used
if left <= 0 then return {0, used} end
local grant = math.min(tonumber(ARGV[1]), left)
used = redis.call('INCRBY', KEYS[1], grant)
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return {grant, used}
