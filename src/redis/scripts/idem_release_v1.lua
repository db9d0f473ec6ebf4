-- idem_release_v1: free the key so that a retry can run, only for the owner of an in-progress claim.
-- KEYS[1] record; ARGV[1] owner. Returns 1 or 0.
if redis.call('HGET', KEYS[1], 'st') == 'P' and redis.call('HGET', KEYS[1], 'own') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
