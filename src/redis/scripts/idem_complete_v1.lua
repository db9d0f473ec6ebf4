-- idem_complete_v1: record the outcome, only for the owner of an in-progress claim.
-- KEYS[1] record; ARGV[1] owner, ARGV[2] state ("C" kept | "U" not kept), ARGV[3] meta (JSON),
-- ARGV[4] body, ARGV[5] retention (ms). Returns 1, or 0 when the owner lost the key.
if redis.call('HGET', KEYS[1], 'st') ~= 'P' or redis.call('HGET', KEYS[1], 'own') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'st', ARGV[2], 'meta', ARGV[3], 'body', ARGV[4])
redis.call('HDEL', KEYS[1], 'own')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
