-- After claim-events.lua: the events from KEYS[1] and ARGV[1].
return claim_events(1, 1, {})
