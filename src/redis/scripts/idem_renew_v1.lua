-- idem_renew_v1: extend the lease, only for its owner while in progress.
-- KEYS[1] record; ARGV[1] owner, ARGV[2] lease (ms). Returns 1 or 0.
if redis.call('HGET', KEYS[1], 'st') == 'P' and redis.call('HGET', KEYS[1], 'own') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
