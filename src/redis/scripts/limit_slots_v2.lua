-- limit_slots_v2: the concurrent-request slots one replica holds of a bucket, declared afresh on
-- each call (a renewal, a larger or a smaller holding): granted up to what the other replicas'
-- live holdings leave. A replica that stops renewing loses its slots when its holding expires.
-- v2: each declaration carries the replica's sequence number, taken when it counted its slots,
-- and one older than the holding's is ignored: declarations sent from several tasks may land out
-- of order, and an older, smaller one landing after a grant would free slots still in use (v1
-- let the fleet run more than the limit). Also says how many replicas hold slots (it sizes each
-- one's chunk). Holdings written by v1 ("slots:expiry") count as sequence -1.
-- KEYS[1] the bucket's holdings, a hash: replica id -> "slots:expiry ms:sequence" (Redis time).
-- KEYS[2] the bucket's fleet queue (limit_queue_v2.lua: its waiting set), read for its length only.
-- ARGV: 1 replica id, 2 slots wanted, 3 limit, 4 ttl ms, 5 the declaration's sequence number.
-- Returns {slots held by the caller now, slots held by the others, requests waiting in the
-- fleet's queue, the replicas holding slots of the bucket, this one included}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local others, holders = 0, 1
local held, held_seq = 0, -1
local seq = tonumber(ARGV[5])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local slots, expiry, s = string.match(all[i + 1], '^(%d+):(%d+):?(%d*)$')
  if slots == nil or tonumber(expiry) <= now then
    redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= ARGV[1] then
    others = others + tonumber(slots)
    holders = holders + 1
  else
    held, held_seq = tonumber(slots), tonumber(s) or -1
  end
end
local waiting = redis.call('ZCARD', KEYS[2])
if seq < held_seq then
  return {held, others, waiting, holders}
end
local grant = math.max(0, math.min(tonumber(ARGV[2]), tonumber(ARGV[3]) - others))
local ttl = tonumber(ARGV[4])
if grant > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], grant .. ':' .. (now + ttl) .. ':' .. seq)
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return {grant, others, waiting, holders}
