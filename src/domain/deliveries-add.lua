-- One sender's recorded deliveries, appended in the order given (src/domain/deliveries.ts), to its
-- stream of verified deliveries or to its stream of unverified ones, under ids of one sequence:
-- every id is above the newest of both streams, so the ids of a sender's two streams compare as
-- the order the deliveries were written in (two streams' own '*' ids of one millisecond do not).
-- KEYS[1]: the sender's verified deliveries. KEYS[2]: its unverified deliveries.
-- ARGV[1]: the verified stream's cap. ARGV[2]: the unverified stream's cap (both trimmed with ~).
-- ARGV[3..]: the deliveries, each as: 'v' or 'u', n (its field and value count), then n strings.
-- Answers the number of deliveries written.
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local lastMs, lastSeq = 0, 0
for i = 1, 2 do
  local newest = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)[1]
  if newest then
    local ms, seq = parse(newest[1])
    if ms > lastMs or (ms == lastMs and seq > lastSeq) then lastMs, lastSeq = ms, seq end
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local i, written = 3, 0
while i <= #ARGV do
  local verified = ARGV[i] == 'v'
  local n = tonumber(ARGV[i + 1])
  if now > lastMs then
    lastMs, lastSeq = now, 0
  else
    lastSeq = lastSeq + 1
  end
  local args = {verified and KEYS[1] or KEYS[2], 'MAXLEN', '~', verified and ARGV[1] or ARGV[2],
    string.format('%d-%d', lastMs, lastSeq)}
  for j = 1, n do args[#args + 1] = ARGV[i + 1 + j] end
  redis.call('XADD', unpack(args))
  written = written + 1
  i = i + 2 + n
end
return written
