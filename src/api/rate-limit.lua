-- A fixed-window rate-limit hit (src/api/rateLimit.ts).
-- KEYS[1]: the client's counter. ARGV[1]: the window in milliseconds.
-- Answers {count in this window, the window's remaining milliseconds}. The window starts with its
-- first hit; a counter that lost its expiry is given one again, so it cannot count forever.
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if n == 1 or ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
