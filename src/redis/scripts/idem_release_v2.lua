-- idem_release_v2: free the key so that a retry can run, only for the owner of an in-progress claim.
-- Safe to run late or more than once (the owner token is checked), so a failed release is sent again
-- until Redis answers.
-- KEYS[1] record; ARGV[1] owner. Returns 1 or 0.
if redis.call('HGET', KEYS[1], 'st') == 'P' and redis.call('HGET', KEYS[1], 'own') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
