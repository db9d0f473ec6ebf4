-- idem_renew_v2: extend the lease, only for its owner while in progress.
-- KEYS[1] record; ARGV[1] owner, ARGV[2] lease (ms), ARGV[3] not_after: Redis TIME (ms) after which
-- the caller has given up on this renewal (0: no bound); a late renewal changes nothing.
-- Returns 1 renewed, 0 not the owner (or not in progress), -1 too late.
local na = tonumber(ARGV[3]) or 0
if na > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > na then
    return -1
  end
end
if redis.call('HGET', KEYS[1], 'st') == 'P' and redis.call('HGET', KEYS[1], 'own') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
