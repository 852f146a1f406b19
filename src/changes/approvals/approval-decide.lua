-- Decides an approval (src/changes/approvals/store.ts): one operator's approval or rejection, its
-- expiry, and the steps of carrying out an approved change.
-- KEYS[1]: the approval's record (JSON). KEYS[2]: the pending set. KEYS[3]: the change's index.
-- ARGV[1]: 'approve', 'reject', 'expire', 'finish', 'fail', 'abandon' or 'supersede'. ARGV[2]: the operator
-- (principal). ARGV[3]: the operator's owner (the person or service behind the credential).
-- ARGV[4]: the operator's credential id ('' for none). ARGV[5]: the reason ('finish': the job id
-- that carries the change; 'fail': the error; 'supersede': the newer job). ARGV[6]: now (ms). ARGV[7]: how long a decided
-- record is kept (ms). ARGV[8]: 'finish': 1 when the change joined another job, else 0.
-- Answers {verdict, record as it is afterwards (JSON)}:
--   'not_found' (no record); 'decided' (already approved, rejected or expired: nothing changed);
--   'expired' (past its expiry: marked expired now); 'pending' ('expire' before the expiry);
--   'self' (an approval by the requester's own owner, the person behind the requester's OIDC token
--   (requester_person), its principal or secret: four eyes compares people, and one secret is one
--   person whatever names it has; the requester may reject, i.e.
--   withdraw, their own request); 'again' (this owner, principal or secret already approved); 'recorded' (approved, more approvals needed); 'approving' (the last approval: the
--   record is `approving` until the change is carried out; also the answer to 'approve', 'reject'
--   and 'expire' of a record already approving, whose caller finishes it);
--   'approved' ('finish': approving -> approved, with its job); 'failed' ('fail': the error kept on
--   the approving record); 'rejected'; 'expired' also for 'abandon' (approving -> expired: nothing
--   was added, its caller gives the budget's place back); 'superseded' ('supersede' of a pending or
--   approving record: a newer change of its group started, so it never runs: closed, naming it).
-- A record leaves the pending set and loses its index only when it is closed (approved, rejected or
-- expired), so a second request for the same change joins it while it is approving.
local raw = redis.call('GET', KEYS[1])
if not raw then return {'not_found', ''} end
local a = cjson.decode(raw)
local action = ARGV[1]
local now = tonumber(ARGV[6])
local function closed(status)
  a.status = status
  a.decided_at = now
  redis.call('ZREM', KEYS[2], a.id)
  if redis.call('GET', KEYS[3]) == a.id then redis.call('DEL', KEYS[3]) end
  local s = cjson.encode(a)
  redis.call('SET', KEYS[1], s, 'PX', ARGV[7])
  return s
end
local function kept()
  local s = cjson.encode(a)
  redis.call('SET', KEYS[1], s, 'KEEPTTL')
  return s
end

if a.status == 'approving' then
  if action == 'finish' then
    a.job_id = ARGV[5]
    a.coalesced = ARGV[8] == '1'
    a.last_error = nil
    return {'approved', closed('approved')}
  end
  if action == 'fail' then
    a.last_error = ARGV[5]
    return {'failed', kept()}
  end
  if action == 'abandon' then
    a.last_error = ARGV[5]
    return {'expired', closed('expired')}
  end
  if action == 'supersede' then
    a.superseded_by = ARGV[5]
    return {'superseded', closed('superseded')}
  end
  return {'approving', raw}
end
if a.status ~= 'pending' then return {'decided', raw} end
if action == 'finish' or action == 'fail' or action == 'abandon' then return {'pending', raw} end
if now >= tonumber(a.expires_at) then return {'expired', closed('expired')} end
if action == 'expire' then return {'pending', raw} end
if action == 'supersede' then
  a.superseded_by = ARGV[5]
  return {'superseded', closed('superseded')}
end
if action == 'reject' then
  a.rejected = {by = ARGV[2], owner = ARGV[3], credential = ARGV[4], reason = ARGV[5], at = now}
  return {'rejected', closed('rejected')}
end
local requester_owner = a.requester_owner
if type(requester_owner) ~= 'string' or requester_owner == '' then requester_owner = a.requester end
local requester_person = a.requester_person
if type(requester_person) ~= 'string' or requester_person == '' then requester_person = nil end
if ARGV[3] == requester_owner or ARGV[3] == requester_person or ARGV[2] == a.requester
  or (ARGV[4] ~= '' and ARGV[4] == a.requester_credential) then
  return {'self', raw}
end
local approvers = a.approvers
if type(approvers) ~= 'table' then approvers = {} end
for _, x in ipairs(approvers) do
  if x.owner == ARGV[3] or x.by == ARGV[2] or (ARGV[4] ~= '' and x.credential == ARGV[4]) then return {'again', raw} end
end
local n = #approvers + 1
approvers[n] = {by = ARGV[2], owner = ARGV[3], credential = ARGV[4], reason = ARGV[5], at = now}
a.approvers = approvers
if n >= tonumber(a.required) then
  a.status = 'approving'
  a.approving_at = now
  return {'approving', kept()}
end
return {'recorded', kept()}
