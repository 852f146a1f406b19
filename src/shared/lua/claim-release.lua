-- KEYS: the keys of every event; ARGV per event: n, the expected value. Deletes each key that
-- still holds it; answers how many.
local deleted = 0
local k, a = 1, 1
while a <= #ARGV do
  local n = tonumber(ARGV[a])
  for i = 0, n - 1 do
    if redis.call('GET', KEYS[k + i]) == ARGV[a + 1] then deleted = deleted + redis.call('DEL', KEYS[k + i]) end
  end
  k, a = k + n, a + 2
end
return deleted
