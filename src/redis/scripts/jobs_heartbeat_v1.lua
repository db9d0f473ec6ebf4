-- jobs_heartbeat_v1: the owner of a running job resets its stream entry's idle time, so that no
-- other worker reclaims it, and keeps the job's record alive.
-- KEYS[1] job hash, KEYS[2] stream.
-- ARGV[1] owner token, ARGV[2] group, ARGV[3] consumer, ARGV[4] entry id, ARGV[5] ttl (ms).
-- Returns 1, or 0 when another worker owns the job now.
if redis.call('HGET', KEYS[1], 'own') ~= ARGV[1] then
  return 0
end
-- Claiming an entry one already holds, with min-idle 0, resets its idle time (JUSTID: the
-- delivery count is left alone).
redis.call('XCLAIM', KEYS[2], ARGV[2], ARGV[3], 0, ARGV[4], 'JUSTID')
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
