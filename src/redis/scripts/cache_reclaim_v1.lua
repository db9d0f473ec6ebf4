-- cache_reclaim_v1: claim a response-cache record for a refresh, in one round trip: as idem_begin_v4,
-- except that a completed record (kept or not) is replaced by the claim (an entry too old for the
-- request's max-age, or a request with `cache-control: no-cache`). The old entry is gone once the
-- claim is made: a refresh that fails leaves no entry, and the next request is a miss.
-- KEYS[1] record; ARGV[1] fingerprint, ARGV[2] owner token, ARGV[3] lease (ms), ARGV[4] not_after
-- (Redis TIME in ms after which the caller has given up; 0: no bound).
-- Returns {"claimed"} | {"mismatch"} | {"in_progress", pttl, owner} | {"late"}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local na = tonumber(ARGV[4]) or 0
if na > 0 and now > na then
  return {'late'}
end
local st = redis.call('HGET', KEYS[1], 'st')
if st then
  if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1] then
    return {'mismatch'}
  end
  if st == 'P' and redis.call('HGET', KEYS[1], 'own') ~= ARGV[2] then
    return {'in_progress', redis.call('PTTL', KEYS[1]), redis.call('HGET', KEYS[1], 'own')}
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'st', 'P', 'fp', ARGV[1], 'own', ARGV[2], 'at', now)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'claimed'}
