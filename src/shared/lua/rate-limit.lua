-- After rate-hit.lua: answers {count, remaining window ms}.
return {rl_n, rl_ttl}
