-- jobs_update_v1: the owner records an outcome (the job's result, or its callback's), drops the
-- request (and its sealed credentials), and acknowledges the stream entry when nothing is left to
-- do. Nothing is written when another worker owns the job now.
-- KEYS[1] job hash, KEYS[2] stream.
-- ARGV[1] owner token, ARGV[2] group, ARGV[3] entry id, ARGV[4] ttl (ms), ARGV[5] '1' to
-- acknowledge the entry, ARGV[6..] field/value pairs.
-- Returns {1, depth} | {0, depth}.
if redis.call('HGET', KEYS[1], 'own') ~= ARGV[1] then
  return {0, redis.call('XLEN', KEYS[2])}
end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('HDEL', KEYS[1], 'req', 'rbody', 'cred')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if ARGV[5] == '1' then
  redis.call('XACK', KEYS[2], ARGV[2], ARGV[3])
  redis.call('XDEL', KEYS[2], ARGV[3])
end
return {1, redis.call('XLEN', KEYS[2])}
