-- The history of deploys (src/changes/deployOrder/history.ts): one step of one deploy, written
-- whole, so two writers (the API that accepted a deploy, the worker that runs it) never lose a
-- step nor move a deploy back to an earlier state.
-- KEYS[1]: every deploy's entry (hash: deploy id -> JSON). KEYS[2]: the project's deploys (sorted
-- set: id by acceptance, ms). KEYS[3]: every project's deploys (the same, for the list of all).
-- KEYS[4]: the project's refs (hash: '<ref>\ncurrent' -> the last succeeded entry's JSON,
-- '<ref>\nrunning' -> the running one's): they outlive the entries the bound drops.
-- ARGV[1]: the deploy id (its queue job id; a deploy waiting for approval: the approval id, which
-- its job takes). ARGV[2]: its acceptance (ms). ARGV[3]: deploys kept per project.
-- ARGV[4]: JSON of the fields written when the entry is first written (project, ref, ...).
-- ARGV[5]: JSON of fields always written (what only the API knows: its origin).
-- ARGV[6]: JSON of the step: its state and the fields that come with it, written unless the entry
-- is in a later state already (pending_approval < held = queued < running < an end).
-- Answers {'written' | 'kept', the state it is in, ids dropped by the bound (comma separated)}.
local RANK = {pending_approval = 0, held = 1, queued = 1, running = 2,
  succeeded = 3, failed = 3, superseded = 3, cancelled = 3, rejected = 3}
local id, at, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local once, info, step = cjson.decode(ARGV[4]), cjson.decode(ARGV[5]), cjson.decode(ARGV[6])

local raw = redis.call('HGET', KEYS[1], id)
local entry
if raw then
  entry = cjson.decode(raw)
else
  entry = once
  entry.id = id
  entry.accepted_at = at
end
for k, v in pairs(info) do entry[k] = v end
local verdict = 'written'
local old = entry.state
if old and step.state and (RANK[old] or 0) > (RANK[step.state] or 0) then
  verdict = 'kept'
elseif old and RANK[old] == 3 then
  verdict = 'kept'
else
  for k, v in pairs(step) do entry[k] = v end
end
local json = cjson.encode(entry)
redis.call('HSET', KEYS[1], id, json)
redis.call('ZADD', KEYS[2], entry.accepted_at, id)
redis.call('ZADD', KEYS[3], entry.accepted_at, id)

local running, current = entry.ref .. '\nrunning', entry.ref .. '\ncurrent'
if entry.state == 'running' then
  redis.call('HSET', KEYS[4], running, json)
elseif RANK[entry.state] == 3 then
  local r = redis.call('HGET', KEYS[4], running)
  if r and cjson.decode(r).id == id then redis.call('HDEL', KEYS[4], running) end
  if entry.state == 'succeeded' then redis.call('HSET', KEYS[4], current, json) end
end

local dropped = {}
local over = redis.call('ZCARD', KEYS[2]) - keep
if over > 0 then
  for _, old_id in ipairs(redis.call('ZRANGE', KEYS[2], 0, over - 1)) do
    redis.call('ZREM', KEYS[2], old_id)
    redis.call('ZREM', KEYS[3], old_id)
    redis.call('HDEL', KEYS[1], old_id)
    dropped[#dropped + 1] = old_id
  end
end
return {verdict, entry.state or '', table.concat(dropped, ',')}
