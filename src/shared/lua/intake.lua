-- After intake-events.lua: BullMQ's add keys in KEYS[1..9], the events' keys from KEYS[10], the
-- batch's arguments from ARGV[1].
return intake_events(1, 10, 1, {})
