-- Gives back a timestamped signature's record (src/middleware/auth.ts) when its delivery was
-- answered 5xx, so the sender's retry of the same request is heard.
-- KEYS[1]: the signature's record. ARGV[1]: the value the request wrote into it.
-- Deletes the record only while it holds that value (never another request's record). Answers 1
-- when deleted, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
