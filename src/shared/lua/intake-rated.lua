-- After rate-hit.lua and intake-events.lua: the request's rate-limit hit first (KEYS[1] the
-- counter, ARGV[1] the window ms), ARGV[2] the limit. Over it, answers {count, ttl} and takes
-- nothing in; else {count, ttl, <the events' answers>}, BullMQ's add keys in KEYS[2..10], the
-- events' keys from KEYS[11], the batch's arguments from ARGV[3].
if rl_n > tonumber(ARGV[2]) then return {rl_n, rl_ttl} end
return intake_events(2, 11, 3, {rl_n, rl_ttl})
