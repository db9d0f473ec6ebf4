-- idem_begin_v1: claim the record or report its state, in one round trip.
-- KEYS[1] record; ARGV[1] fingerprint, ARGV[2] owner token, ARGV[3] lease (ms).
-- Returns {"claimed"} | {"mismatch"} | {"in_progress", pttl} | {"not_kept"} | {"completed", meta, body}.
local st = redis.call('HGET', KEYS[1], 'st')
if not st then
  redis.call('HSET', KEYS[1], 'st', 'P', 'fp', ARGV[1], 'own', ARGV[2])
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
  return {'in_progress', redis.call('PTTL', KEYS[1])}
end
if st == 'U' then
  return {'not_kept'}
end
return {'completed', redis.call('HGET', KEYS[1], 'meta'), redis.call('HGET', KEYS[1], 'body')}
