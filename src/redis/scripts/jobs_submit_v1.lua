-- jobs_submit_v1: create a job and queue it, unless a job with this id exists (the same
-- Idempotency-Key from the same tenant) or the queue is full. One round trip; both keys carry the
-- {jobs} hash tag, so the script is valid on Redis Cluster.
-- KEYS[1] job hash, KEYS[2] stream.
-- ARGV[1] job id, ARGV[2] fingerprint ('' without a key), ARGV[3] max unfinished jobs,
-- ARGV[4] ttl (ms), ARGV[5] stream MAXLEN backstop, ARGV[6..] the new job's field/value pairs.
-- Returns {'queued', depth} | {'exists', state} | {'mismatch'} | {'full', depth}.
local st = redis.call('HGET', KEYS[1], 'st')
if st then
  if redis.call('HGET', KEYS[1], 'fp') ~= ARGV[2] then
    return {'mismatch'}
  end
  return {'exists', st}
end
-- Finished entries are deleted from the stream: its length is the number of unfinished jobs.
local depth = redis.call('XLEN', KEYS[2])
if depth >= tonumber(ARGV[3]) then
  return {'full', depth}
end
redis.call('HSET', KEYS[1], 'st', 'queued', 'fp', ARGV[2], unpack(ARGV, 6))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'job', ARGV[1])
return {'queued', depth + 1}
