-- jobs_start_v1: a worker takes the job of a stream entry it received (new, or reclaimed from a
-- worker that stopped heartbeating). The owner token is the compare-and-set that makes one worker
-- the job's only owner: every later write checks it.
-- KEYS[1] job hash, KEYS[2] stream.
-- ARGV[1] owner token, ARGV[2] now (unix ms), ARGV[3] max runs, ARGV[4] group, ARGV[5] entry id,
-- ARGV[6] ttl (ms).
-- Returns {'run', runs, req, body, cred, route, callback} | {'callback'} | {'skip'} | {'abandoned', route}.
local function done()
  redis.call('XACK', KEYS[2], ARGV[4], ARGV[5])
  redis.call('XDEL', KEYS[2], ARGV[5])
end
local st = redis.call('HGET', KEYS[1], 'st')
if not st then
  -- Expired (queued for longer than result_ttl) or purged.
  done()
  return {'skip'}
end
if st == 'succeeded' or st == 'failed' then
  if redis.call('HGET', KEYS[1], 'cbst') == 'pending' then
    -- Finished, but its worker died before the callback was delivered.
    redis.call('HSET', KEYS[1], 'own', ARGV[1])
    return {'callback'}
  end
  done()
  return {'skip'}
end
local runs = tonumber(redis.call('HGET', KEYS[1], 'runs') or '0')
if runs >= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[1], 'st', 'failed', 'finished', ARGV[2], 'own', '',
    'err', 'abandoned: its worker stopped ' .. runs .. ' times before finishing it')
  redis.call('HDEL', KEYS[1], 'req', 'rbody', 'cred')
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  done()
  return {'abandoned', redis.call('HGET', KEYS[1], 'route')}
end
redis.call('HSET', KEYS[1], 'st', 'running', 'own', ARGV[1])
redis.call('HSETNX', KEYS[1], 'started', ARGV[2])
redis.call('HSET', KEYS[1], 'runs', runs + 1)
redis.call('PEXPIRE', KEYS[1], ARGV[6])
local function field(name)
  return redis.call('HGET', KEYS[1], name) or ''
end
return {'run', runs + 1, field('req'), field('rbody'), field('cred'), field('route'), field('cb')}
