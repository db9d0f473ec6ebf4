-- dead_letter_replay_v1: append a replay record to a dead letter's list, atomically.
-- KEYS[1] the replays hash; ARGV[1] the entry id, ARGV[2] the record (JSON object). Returns 1.
local list = redis.call('HGET', KEYS[1], ARGV[1])
if list then
  list = string.sub(list, 1, -2) .. ',' .. ARGV[2] .. ']'
else
  list = '[' .. ARGV[2] .. ']'
end
redis.call('HSET', KEYS[1], ARGV[1], list)
return 1
