-- KEYS[1] a record; ARGV[1] the job id. Deletes it only while it names that job: an intake record
-- "q:<id>" (QUEUED in src/domain/claim.ts) or a JSON answer with job_id <id>.
-- One key per call (a Cluster may spread them).
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v == 'q:' .. ARGV[1] then return redis.call('DEL', KEYS[1]) end
if string.sub(v, 1, 1) == '{' then
  local ok, doc = pcall(cjson.decode, v)
  if ok and type(doc) == 'table' and doc.job_id == ARGV[1] then return redis.call('DEL', KEYS[1]) end
end
return 0
