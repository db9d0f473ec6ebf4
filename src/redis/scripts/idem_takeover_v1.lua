-- idem_takeover_v1: claim a record still in progress under the claim of a replica that is dead (its
-- liveness record lapsed: it stopped heartbeating), instead of waiting for that claim's lease.
-- Only while that claim still holds it, for the same request (fingerprint): a record completed,
-- released or taken over meanwhile is left alone.
-- KEYS[1] record; ARGV[1] fingerprint, ARGV[2] the dead claim's owner, ARGV[3] the new owner,
-- ARGV[4] lease (ms), ARGV[5] not_after: Redis TIME (ms) after which the caller has given up on this
-- takeover (0: no bound), as in idem_begin_v4; ARGV[6] liveness (ms): a claim younger than this
-- (its 'at') is left alone, since its replica may not have written its liveness record yet.
-- Returns 1 taken over, 0 the record changed (look again), -1 too late, -2 the claim is too young.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local na = tonumber(ARGV[5]) or 0
if na > 0 and now > na then
  return -1
end
local r = redis.call('HMGET', KEYS[1], 'st', 'own', 'fp', 'at')
if r[1] == 'P' and r[2] == ARGV[2] and r[3] == ARGV[1] then
  if now - (tonumber(r[4]) or now) < tonumber(ARGV[6]) then
    return -2
  end
  redis.call('HSET', KEYS[1], 'own', ARGV[3], 'at', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 1
end
return 0
