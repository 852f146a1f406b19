-- The guard of one rule's remediations of one Deployment (src/remediation/store.ts): its cooldown
-- and its escalation, decided at once for every replica.
-- KEYS[1]: the cooldown (the id of the remediation that started it). KEYS[2]: the remediations in
-- the escalation window (sorted set, member = id, score = ms). KEYS[3]: the escalated flag.
-- ARGV[1]: 'claim' or 'release'. ARGV[2]: the remediation's id. ARGV[3]: now (ms).
-- ARGV[4]: the cooldown (ms). ARGV[5]: the escalation window (ms). ARGV[6]: escalate_after.
-- 'claim' answers {verdict, n}:
--   'escalate' (n remediations in the window already: the caller pages, once; the flag lasts the window);
--   'escalated' (paged already in this window: nothing);
--   'cooldown' (n = ms left of the cooldown);
--   'claimed' (the cooldown starts, the remediation is counted; n = remediations in the window with it).
-- 'release' gives back a claim whose change was not carried out (refused, over budget, failed):
--   the cooldown if it is still this id's, and its place in the window; answers {'released', 0}.
local id = ARGV[2]
if ARGV[1] == 'release' then
  if redis.call('GET', KEYS[1]) == id then redis.call('DEL', KEYS[1]) end
  redis.call('ZREM', KEYS[2], id)
  return {'released', 0}
end
local now = tonumber(ARGV[3])
local window = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
local n = redis.call('ZCARD', KEYS[2])
if n >= tonumber(ARGV[6]) then
  if redis.call('SET', KEYS[3], id, 'NX', 'PX', window) then return {'escalate', n} end
  return {'escalated', n}
end
local left = redis.call('PTTL', KEYS[1])
if left > 0 then return {'cooldown', left} end
redis.call('SET', KEYS[1], id, 'PX', ARGV[4])
redis.call('ZADD', KEYS[2], now, id)
redis.call('PEXPIRE', KEYS[2], window)
return {'claimed', n + 1}
