-- The claim loop over a batch of events, reading KEYS from index k and ARGV from index a, and
-- appending one answer per event to out.
-- KEYS: the keys of every event, event after event. ARGV per event: its number of keys n, its
-- pending value, then the ttl (s) of each of its n keys. Per event: when none of its keys exists,
-- sets them all to the pending value (answer ""); else answers the first existing value and
-- records it on the keys that lack it (so a later delivery found by any key sees it).
local function claim_events(k, a, out)
  while a <= #ARGV do
    local n = tonumber(ARGV[a])
    local found = false
    for i = 0, n - 1 do
      found = redis.call('GET', KEYS[k + i])
      if found then break end
    end
    local value = found or ARGV[a + 1]
    for i = 0, n - 1 do
      redis.call('SET', KEYS[k + i], value, 'EX', ARGV[a + 2 + i], 'NX')
    end
    out[#out + 1] = found or ''
    k, a = k + n, a + 2 + n
  end
  return out
end
