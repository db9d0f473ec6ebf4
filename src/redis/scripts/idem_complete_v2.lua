-- idem_complete_v2: record the outcome of a delivered response. Safe to run more than once (a
-- completion whose reply was lost is sent again until one lands).
-- KEYS[1] record; ARGV[1] owner, ARGV[2] state ("C" kept | "U" not kept), ARGV[3] meta (JSON),
-- ARGV[4] body, ARGV[5] retention (ms), ARGV[6] fingerprint.
-- Returns 1 written; 2 already written by this owner (an earlier try landed); 0 another owner holds
-- or completed the key (a duplicate ran: nothing is overwritten).
-- An absent record (the claim lapsed while Redis was unreachable, or Redis restarted empty) is held
-- by nobody, so the delivered response is recorded: a retry then replays it instead of running again.
local st = redis.call('HGET', KEYS[1], 'st')
if st then
  if redis.call('HGET', KEYS[1], 'own') ~= ARGV[1] then
    return 0
  end
  if st ~= 'P' then
    return 2
  end
end
redis.call('HSET', KEYS[1], 'st', ARGV[2], 'fp', ARGV[6], 'own', ARGV[1], 'meta', ARGV[3], 'body', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
