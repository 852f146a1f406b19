-- A rate-limit hit, run first by the limiter's own script and by the rated claim script.
-- KEYS[1] = counter key, ARGV[1] = window ms. Leaves the count in rl_n and the window's
-- remaining milliseconds in rl_ttl. The TTL is set when the counter is created, and repaired if
-- the key ever lost it.
local rl_n = redis.call('INCR', KEYS[1])
local rl_ttl = redis.call('PTTL', KEYS[1])
if rl_n == 1 or rl_ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  rl_ttl = tonumber(ARGV[1])
end
