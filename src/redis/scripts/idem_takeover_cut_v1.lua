-- idem_takeover_cut_v1: a follower of a live response whose owner's replica died mid-stream claims
-- the record to continue that response (one continuation for every follower, fleet-wide), as
-- idem_takeover_v1 does, and writes what it continues from: 'cut' = "{new owner} {bytes}". The
-- followers that lose read the new owner's response from that byte on, when the record's 'cut'
-- names its current owner (a takeover that restarts the request writes no 'cut' of its owner).
-- KEYS[1] record; ARGV[1] fingerprint, ARGV[2] the dead claim's owner, ARGV[3] the new owner,
-- ARGV[4] lease (ms), ARGV[5] not_after: Redis TIME (ms) after which the caller has given up (0: no
-- bound), ARGV[6] liveness (ms): a claim younger than this is left alone, ARGV[7] the bytes of the
-- response the new owner has (and continues after).
-- Returns {1} taken over, {-1} too late, {-2} the claim is too young, else {0, st, own, cut}: the
-- record as it is now.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local na = tonumber(ARGV[5]) or 0
if na > 0 and now > na then
  return {-1}
end
local r = redis.call('HMGET', KEYS[1], 'st', 'own', 'fp', 'at', 'cut')
if r[1] == 'P' and r[2] == ARGV[2] and r[3] == ARGV[1] then
  if now - (tonumber(r[4]) or now) < tonumber(ARGV[6]) then
    return {-2}
  end
  redis.call('HSET', KEYS[1], 'own', ARGV[3], 'at', now, 'cut', ARGV[3] .. ' ' .. ARGV[7])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {1}
end
return {0, r[1] or '', r[2] or '', r[5] or ''}
