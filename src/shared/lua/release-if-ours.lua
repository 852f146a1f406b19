-- KEYS[1] a key, ARGV[1] the value we set: deletes the key only while it still holds that value.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0
