-- limit_adjust_v1: what a replica spent beyond its lease (a usage larger than its reservation:
-- charged, the fleet's counter may pass the limit) or did not spend of it (given back).
-- KEYS[1] the window's counter. ARGV: 1 signed amount, 2 ttl ms.
-- Returns the counter after the change (never below zero).
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local after = math.max(0, used + tonumber(ARGV[1]))
redis.call('SET', KEYS[1], after, 'KEEPTTL')
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return after
