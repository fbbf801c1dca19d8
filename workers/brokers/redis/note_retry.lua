-- include: _shared.lua
-- One more failed call of an in-flight message: count it and keep the time of the first
-- failure (both forgotten when the message is acknowledged).
-- KEYS: the shard's deliveries hash. ARGV: the message's sha1.
-- Returns {retries, ms since the first failure}.
local now = now_ms()
local retries = redis.call('HINCRBY', KEYS[1], ARGV[1] .. NOTES.retries, 1)
redis.call('HSETNX', KEYS[1], ARGV[1] .. NOTES.since, now)
return {retries, now - tonumber(redis.call('HGET', KEYS[1], ARGV[1] .. NOTES.since))}
