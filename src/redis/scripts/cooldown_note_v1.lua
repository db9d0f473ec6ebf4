-- cooldown_note_v1: no calls with this credential before now + ms (Redis time), keeping the later
-- deadline; a change is published so that every replica blocks the credential at once.
-- KEYS[1] the upstream's cooldown hash ({prefix}cooldown:{upstream}).
-- ARGV: 1 credential hash, 2 ms, 3 channel, 4 upstream.
-- Returns 1 when it extended the cooldown, 0 when one at least as long was in force.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ms = tonumber(ARGV[2])
local till = now + ms
if till <= tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], till)
if redis.call('PTTL', KEYS[1]) < ms then redis.call('PEXPIRE', KEYS[1], ms) end
redis.call('PUBLISH', ARGV[3], cjson.encode({k = 'cool', u = ARGV[4], c = ARGV[1], ms = ms}))
return 1
