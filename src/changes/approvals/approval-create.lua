-- Records a new approval, or finds the one that already stands for the same change (src/changes/approvals/store.ts).
-- KEYS[1]: the new approval's record. KEYS[2]: the change's index (approval-for:<identity>).
-- KEYS[3]: the pending set (member = approval id, score = expiry in ms).
-- ARGV[1]: the approval id. ARGV[2]: its record (JSON). ARGV[3]: its expiry (ms since the epoch).
-- ARGV[4]: how long the record is kept (ms). ARGV[5]: now (ms).
-- Answers {1, id} when recorded, or {0, id}: the pending approval of the same change (the index
-- names it until it is decided or expires), or this id again (its record exists: a repeat).
local existing = redis.call('GET', KEYS[2])
if existing then return {0, existing} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, ARGV[1]} end
local ttl = tonumber(ARGV[3]) - tonumber(ARGV[5])
if ttl < 1 then ttl = 1 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[4])
redis.call('SET', KEYS[2], ARGV[1], 'PX', ttl)
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
return {1, ARGV[1]}
