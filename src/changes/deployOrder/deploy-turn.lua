-- A concurrency group of deploys (src/changes/deployOrder/store.ts): which deploy runs, and whether
-- one may start, in the order opsgate accepted them.
-- KEYS[1]: the group's record (hash: running, running_until, started_at, started_id, started_job,
-- newest_at, newest_id, newest_job).
-- ARGV[1]: 'begin' (a deploy's job asks to start), 'release' (it ended), or 'check' (would a
-- resubmission of that acceptance still run: nothing written).
-- ARGV[2]: the queue job id. ARGV[3]: the acceptance time (ms). ARGV[4]: the acceptance id (the job
-- id it was accepted under; decides between deploys accepted in the same millisecond). ARGV[5]: now
-- (ms). ARGV[6]: the lease of a running deploy (ms): past it, a running deploy whose worker died no
-- longer holds the group.
-- Answers {verdict, job}:
--   'run' (begin: it runs now, recorded as running and as the last started);
--   'wait' (begin: another deploy of the group runs, named; it is recorded as newest if it is);
--   'superseded' (begin or check: a deploy accepted after it started already, or, for begin, one
--   accepted after it waits to run: named);
--   'ok' (check: nothing accepted after it has started);
--   'released' / 'not_running' (release: it was the running one, naming the newest deploy waiting
--   for its turn if there is one / it was not).
local key = KEYS[1]
local action, job = ARGV[1], ARGV[2]
local at, id = tonumber(ARGV[3]), ARGV[4]
local now, lease = tonumber(ARGV[5]), tonumber(ARGV[6])

-- Whether acceptance (a_at, a_id) came after (b_at, b_id): by time, then by id (numerically when
-- both are numbers, as BullMQ's own ids are).
local function after(a_at, a_id, b_at, b_id)
  if a_at ~= b_at then return a_at > b_at end
  local an = string.match(a_id, '^%d+$') and tonumber(a_id)
  local bn = string.match(b_id, '^%d+$') and tonumber(b_id)
  if an and bn then return an > bn end
  return a_id > b_id
end

local f = redis.call('HMGET', key, 'running', 'running_until', 'started_at', 'started_id', 'started_job',
  'newest_at', 'newest_id', 'newest_job')
local running, running_until = f[1], tonumber(f[2] or '0')
local started_at, started_id, started_job = tonumber(f[3] or ''), f[4], f[5]
local newest_at, newest_id, newest_job = tonumber(f[6] or ''), f[7], f[8]

if action == 'release' then
  if running == job then
    redis.call('HDEL', key, 'running', 'running_until')
    if newest_at and newest_job ~= job and (not started_at or after(newest_at, newest_id, started_at, started_id)) then
      return {'released', newest_job}
    end
    return {'released', ''}
  end
  return {'not_running', ''}
end

-- A deploy accepted after this one has started: this one never runs.
if started_at and after(started_at, started_id, at, id) then
  return {'superseded', started_job}
end
if action == 'check' then return {'ok', ''} end

-- The same job again (its next attempt, or a worker that lost it): it keeps the group.
if running == job then
  redis.call('HSET', key, 'running_until', now + lease)
  return {'run', ''}
end
if not newest_at or after(at, id, newest_at, newest_id) then
  redis.call('HSET', key, 'newest_at', at, 'newest_id', id, 'newest_job', job)
elseif after(newest_at, newest_id, at, id) then
  return {'superseded', newest_job}
end
if running and running_until > now then return {'wait', running} end
redis.call('HSET', key, 'running', job, 'running_until', now + lease, 'started_at', at, 'started_id', id, 'started_job', job)
return {'run', ''}
