-- KEYS per event: BullMQ's deduplication key of the event, then its n seen keys; ARGV per event:
-- n, the pending value. If the add put the event on the queue (the dedup key names its job), every
-- seen key still holding the pending value becomes "q:<that job id>" (TTL kept; "q:" is QUEUED in
-- src/domain/claim.ts). Answers, per event, the job id or "".
local out = {}
local k, a = 1, 1
while a <= #ARGV do
  local n = tonumber(ARGV[a])
  local id = redis.call('GET', KEYS[k])
  if id then
    for i = 1, n do
      if redis.call('GET', KEYS[k + i]) == ARGV[a + 1] then redis.call('SET', KEYS[k + i], 'q:' .. id, 'KEEPTTL') end
    end
  end
  out[#out + 1] = id or ''
  k, a = k + 1 + n, a + 2
end
return out
