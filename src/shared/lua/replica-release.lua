-- Takes back a record of a write that was not replicated (src/domain/replication.ts).
-- KEYS[1]: a record (one key per call: a Cluster may spread them). ARGV[1]: the job id.
-- Deletes the record only while it names that job: an intake alias "q:<id>" or a restart's
-- Idempotency-Key answer (JSON with job_id <id>). Answers 1 when deleted, else 0.
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v == 'q:' .. ARGV[1] then return redis.call('DEL', KEYS[1]) end
if string.sub(v, 1, 1) == '{' then
  local ok, doc = pcall(cjson.decode, v)
  if ok and type(doc) == 'table' and doc.job_id == ARGV[1] then return redis.call('DEL', KEYS[1]) end
end
return 0
