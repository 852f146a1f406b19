-- Decides an approval: one operator's approval or rejection, or its expiry (src/shared/approvals.ts).
-- KEYS[1]: the approval's record (JSON). KEYS[2]: the pending set. KEYS[3]: the change's index.
-- KEYS[4]: the restart budget of the change's namespace (sorted set: member = job id, score = ms);
-- untouched when ARGV[6] is 0.
-- ARGV[1]: 'approve', 'reject' or 'expire'. ARGV[2]: the operator (principal). ARGV[3]: the
-- operator's credential id ('' for none). ARGV[4]: the reason. ARGV[5]: now (ms). ARGV[6]: the
-- budget's restarts (0: no budget). ARGV[7]: the budget's window (ms). ARGV[8]: how long a decided
-- record is kept (ms).
-- Answers {verdict, record as it is afterwards (JSON), retry ms}:
--   'not_found' (no record); 'decided' (already approved, rejected or expired: nothing changed);
--   'expired' (past its expiry: marked expired now); 'pending' ('expire' before the expiry);
--   'self' (an approval by the requester's own principal or credential: four eyes; the requester
--   may reject, i.e. withdraw, their own request); 'again' (this operator already approved);
--   'budget' (the last approval would exceed the budget: nothing changed; retry ms: when the
--   oldest restart leaves the window); 'recorded' (approved, more approvals needed);
--   'approved' (the last approval: the change goes, its budget taken); 'rejected'.
-- The record's approvers are a list of {by, credential, reason, at}; a decided record loses its
-- index and its place in the pending set in the same step, so exactly one caller sees 'approved'.
local raw = redis.call('GET', KEYS[1])
if not raw then return {'not_found', '', 0} end
local a = cjson.decode(raw)
local now = tonumber(ARGV[5])
local function closed(status)
  a.status = status
  a.decided_at = now
  redis.call('ZREM', KEYS[2], a.id)
  if redis.call('GET', KEYS[3]) == a.id then redis.call('DEL', KEYS[3]) end
  local s = cjson.encode(a)
  redis.call('SET', KEYS[1], s, 'PX', ARGV[8])
  return s
end
if a.status ~= 'pending' then return {'decided', raw, 0} end
if now >= tonumber(a.expires_at) then return {'expired', closed('expired'), 0} end
if ARGV[1] == 'expire' then return {'pending', raw, 0} end
if ARGV[1] == 'reject' then
  a.rejected = {by = ARGV[2], credential = ARGV[3], reason = ARGV[4], at = now}
  return {'rejected', closed('rejected'), 0}
end
if ARGV[2] == a.requester or (ARGV[3] ~= '' and ARGV[3] == a.requester_credential) then return {'self', raw, 0} end
local approvers = a.approvers
if type(approvers) ~= 'table' then approvers = {} end
for _, x in ipairs(approvers) do
  if x.by == ARGV[2] or (ARGV[3] ~= '' and x.credential == ARGV[3]) then return {'again', raw, 0} end
end
local n = #approvers + 1
local last = n >= tonumber(a.required)
if last and tonumber(ARGV[6]) > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[7]))
  if not redis.call('ZSCORE', KEYS[4], a.id) then
    if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[6]) then
      local oldest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
      return {'budget', raw, tonumber(oldest[2]) + tonumber(ARGV[7]) - now}
    end
    redis.call('ZADD', KEYS[4], now, a.id)
    redis.call('PEXPIRE', KEYS[4], ARGV[7])
  end
end
approvers[n] = {by = ARGV[2], credential = ARGV[3], reason = ARGV[4], at = now}
a.approvers = approvers
if last then return {'approved', closed('approved'), 0} end
local s = cjson.encode(a)
redis.call('SET', KEYS[1], s, 'KEEPTTL')
return {'recorded', s, 0}
