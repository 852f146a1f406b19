-- Takes one restart from each budget a restart draws on, all or none (src/changes/budget/store.ts):
-- sliding windows, and the one place a window is computed, for a take and for a look (a dry run).
-- KEYS[1], KEYS[2], ...: each a budget (sorted set: member = the restart's job id, score = when it was taken, ms).
-- ARGV[1]: now (ms). ARGV[2]: the job id taking it (the same id taking again takes nothing more).
-- ARGV[3]: 'take' or 'peek' (answer as a take would, taking nothing).
-- ARGV[2 + 2i], ARGV[3 + 2i]: the window (ms) and the restarts allowed of KEYS[i].
-- Answers {1, 0, 0, used_1, retry_1, ...} when taken (used: restarts in the window, this one
-- included), or {0, i, retry ms, used_1, retry_1, ...} when KEYS[i] is spent until its oldest
-- restart leaves the window (the first spent one; nothing taken from any).
local now = tonumber(ARGV[1])
local id = ARGV[2]
local peek = ARGV[3] == 'peek'
local out = {}
local spent, spentRetry = 0, 0
for i = 1, #KEYS do
  local window = tonumber(ARGV[2 + 2 * i])
  local limit = tonumber(ARGV[3 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - window)
  local used = redis.call('ZCARD', KEYS[i])
  local retry = 0
  if not redis.call('ZSCORE', KEYS[i], id) and used >= limit then
    local oldest = redis.call('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    retry = tonumber(oldest[2]) + window - now
    if spent == 0 then spent, spentRetry = i, retry end
  end
  out[#out + 1] = used
  out[#out + 1] = retry
end
if spent > 0 or peek then
  local head = {spent == 0 and 1 or 0, spent, spentRetry}
  for _, v in ipairs(out) do head[#head + 1] = v end
  return head
end
local head = {1, 0, 0}
for i = 1, #KEYS do
  local window = tonumber(ARGV[2 + 2 * i])
  if not redis.call('ZSCORE', KEYS[i], id) then
    redis.call('ZADD', KEYS[i], now, id)
    out[2 * i - 1] = out[2 * i - 1] + 1
  end
  redis.call('PEXPIRE', KEYS[i], window)
end
for _, v in ipairs(out) do head[#head + 1] = v end
return head
