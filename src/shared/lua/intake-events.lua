-- The intake loop over a batch of events: each event's claim and its job in one atomic step, so
-- a seen record never exists without its job, nor a job without its record, whatever fails or
-- is killed between requests. Needs bull_add (BullMQ's own add script as a function,
-- src/shared/queue.ts). Reads BullMQ's nine add keys from KEYS[q], the events' keys from KEYS[k]
-- and the batch's arguments from ARGV[a], and appends one answer per event to out.
-- KEYS from k: the keys of every event, event after event (its content key, its delivery keys).
-- ARGV from a: the jobs' timestamp (ms) and job name (one per batch), then per event: its number
-- of keys n, its job id, the ttl (s) of each of its n keys, its job's data JSON.
-- bull_templates[name] (src/shared/queue.ts) holds BullMQ's packed argument list and packed
-- options of an add of a job of that name, as BullMQ encodes Queue#add's; the job's id is the
-- list's 2nd item and the options' jobId, its timestamp the list's 4th.
-- Per event: when none of its keys exists, adds the template with the event's job id and data,
-- and records "q:<job id>" on every key ("q:" is QUEUED in src/domain/claim.ts), answering
-- "+<job id>" (BullMQ answers the id of a job that already has it); else answers the first value
-- found and records it on the keys that lack it, so a later delivery found by any key sees it.
-- A "p:<job id>" record is the pending claim of an API of version 0.1.0 (claim first, add
-- second, with BullMQ's deduplication key of the event, named after its key without the seen
-- prefix): its job is made sure of as that version's retry did (the deduplication key's job if
-- there is one, else an add under that id), and the record becomes "q:<that id>". The pieces
-- before this one name those keys: seen_prefix, the seen records' prefix (src/shared/keys.ts),
-- and bull_dedup_prefix, the queue's deduplication keys' (src/shared/queue.ts).
local function intake_events(q, k, a, out)
  local add_keys = {}
  for i = 0, 8 do add_keys[i + 1] = KEYS[q + i] end
  local timestamp = tonumber(ARGV[a])
  local template = bull_templates[ARGV[a + 1]]
  if not template then return redis.error_reply('no BullMQ template for job ' .. tostring(ARGV[a + 1])) end
  -- Unpacked at the first event that needs a job: a batch of duplicates never does.
  local job_args, job_opts
  local function add(id, data)
    if not job_args then
      job_args, job_opts = cmsgpack.unpack(template.args), cmsgpack.unpack(template.opts)
      job_args[4] = timestamp
    end
    job_args[2] = id
    job_opts['jobId'] = id
    local added = bull_add(add_keys, {cmsgpack.pack(job_args), data, cmsgpack.pack(job_opts)})
    if type(added) ~= 'string' then error(redis.error_reply('BullMQ add answered ' .. tostring(added))) end
    return added
  end
  a = a + 2
  while a <= #ARGV do
    local n = tonumber(ARGV[a])
    local found, found_at = false, -1
    for i = 0, n - 1 do
      found = redis.call('GET', KEYS[k + i])
      if found then
        found_at = i
        break
      end
    end
    local value = found
    if found and string.sub(found, 1, 2) == 'p:' then
      local id = redis.call('GET', bull_dedup_prefix .. string.sub(KEYS[k], #seen_prefix + 1))
      if not id then id = add(string.sub(found, 3), ARGV[a + 2 + n]) end
      value = 'q:' .. id
      for i = 0, n - 1 do
        if redis.call('GET', KEYS[k + i]) == found then redis.call('SET', KEYS[k + i], value, 'KEEPTTL') end
      end
      out[#out + 1] = value
    elseif found then
      out[#out + 1] = found
    else
      value = 'q:' .. add(ARGV[a + 1], ARGV[a + 2 + n])
      out[#out + 1] = '+' .. string.sub(value, 3)
    end
    for i = 0, n - 1 do
      if i ~= found_at then redis.call('SET', KEYS[k + i], value, 'EX', ARGV[a + 2 + i], 'NX') end
    end
    k, a = k + n, a + 3 + n
  end
  return out
end
