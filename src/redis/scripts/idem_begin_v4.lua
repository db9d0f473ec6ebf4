-- idem_begin_v4: claim the record or report its state, in one round trip.
-- KEYS[1] record; ARGV[1] fingerprint, ARGV[2] owner token, ARGV[3] lease (ms),
-- ARGV[4] not_after: Redis TIME (ms) after which the caller has given up waiting; 0: no bound.
-- A claim that runs after not_after (it sat in the socket buffer of a frozen or stalled Redis while
-- the request was answered 503 or forwarded unprotected) is refused, so that no claim outlives the
-- request that made it.
-- v3: an in-progress reply carries the owner token, which names the relay of the original's
-- response to followers on other replicas (`on_concurrent = "follow"`).
-- v4: a claim records when it was made ('at', Redis TIME in ms): a claim younger than one
-- `[redis] liveness` is never taken for a dead replica's (its owner may not have beaten yet).
-- Returns {"claimed"} | {"mismatch"} | {"in_progress", pttl, owner} | {"not_kept"} | {"completed", meta, body}
-- | {"late"}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local na = tonumber(ARGV[4]) or 0
if na > 0 and now > na then
  return {'late'}
end
local st = redis.call('HGET', KEYS[1], 'st')
if not st then
  redis.call('HSET', KEYS[1], 'st', 'P', 'fp', ARGV[1], 'own', ARGV[2], 'at', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'claimed'}
end
if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[1] then
  return {'mismatch'}
end
if st == 'P' then
  if redis.call('HGET', KEYS[1], 'own') == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return {'claimed'}
  end
  return {'in_progress', redis.call('PTTL', KEYS[1]), redis.call('HGET', KEYS[1], 'own')}
end
if st == 'U' then
  return {'not_kept'}
end
return {'completed', redis.call('HGET', KEYS[1], 'meta'), redis.call('HGET', KEYS[1], 'body')}
