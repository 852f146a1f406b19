-- Takes one restart from a namespace's budget, a sliding window (src/changes/budget/store.ts); the
-- one place the window is computed, for a take and for a look (a dry run).
-- KEYS[1]: the budget (sorted set: member = the restart's job id, score = when it was taken, ms).
-- ARGV[1]: now (ms). ARGV[2]: the window (ms). ARGV[3]: the restarts allowed in the window.
-- ARGV[4]: the job id taking it (the same id taking again takes nothing more). ARGV[5]: 'peek' to
-- answer as a take would without taking (optional).
-- Answers {1, used, 0} when taken (used: restarts in the window, this one included), or
-- {0, used, retry ms}: the budget is spent until the oldest restart leaves the window.
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local used = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[4]) then return {1, used, 0} end
if used >= tonumber(ARGV[3]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, used, tonumber(oldest[2]) + window - now}
end
if ARGV[5] == 'peek' then return {1, used, 0} end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1], window)
return {1, used + 1, 0}
