-- After rate-hit.lua and claim-events.lua: the request's rate-limit hit first (KEYS[1] the
-- counter, ARGV[1] the window ms), ARGV[2] the limit. Over it, answers {count, ttl} and claims
-- nothing; else {count, ttl, <the claim answers>}, the events' KEYS and ARGV following.
if rl_n > tonumber(ARGV[2]) then return {rl_n, rl_ttl} end
return claim_events(2, 3, {rl_n, rl_ttl})
