-- May a call to a destination start now? Limits: calls in flight (a sorted set of slots
-- whose scores are expiry times, so a slot of a worker killed mid-call frees itself), calls
-- per second (a token bucket holding at most one token) and a pause after Retry-After.
-- A slot already held (the same message, resumed after a crash) is kept. Time is Redis's
-- own clock, so every worker measures against the same one. The bucket fills at the
-- configured rate, or at the adapted one (``adapted``, kept by FLOW_RELEASE after a 429)
-- when that is lower; a destination that does not adapt drops it.
-- KEYS = (calls, bucket, counters, destinations set); ARGV = (slot, max in flight (0: none),
-- configured rate per s (0: none), slot ttl ms, destination name, adaptive (1/0)).
-- Returns {1, 0, 'ok'} or {0, wait ms, why}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- A slot's expiry to the microsecond (as text: Lua would round a number to 14 digits), so
-- that FLOW_RELEASE can tell a call started before a rate cut from one started after it.
local expiry = string.format('%.3f', tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000 + tonumber(ARGV[4]))
local max, rate = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('SADD', KEYS[4], ARGV[5])
redis.call('HSET', KEYS[2], 'max', ARGV[2], 'rate', ARGV[3])
local adapted = tonumber(redis.call('HGET', KEYS[2], 'adapted') or '0')
if ARGV[6] ~= '1' and adapted > 0 then
  redis.call('HDEL', KEYS[2], 'adapted', 'cut_rate')
elseif adapted > 0 and (rate == 0 or adapted < rate) then
  rate = adapted
end
local paused = tonumber(redis.call('HGET', KEYS[2], 'paused') or '0')
if paused > now then
  redis.call('HINCRBY', KEYS[3], 'waits', 1)
  return {0, paused - now, 'paused'}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZADD', KEYS[1], expiry, ARGV[1])
  redis.call('HINCRBY', KEYS[3], 'calls', 1)
  return {1, 0, 'ok'}
end
if max > 0 and redis.call('ZCARD', KEYS[1]) >= max then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  redis.call('HINCRBY', KEYS[3], 'waits', 1)
  return {0, math.max(1, math.min(1000, tonumber(first[2]) - now)), 'in_flight'}
end
if rate > 0 then
  local tokens = tonumber(redis.call('HGET', KEYS[2], 'tokens') or '1')
  local ts = tonumber(redis.call('HGET', KEYS[2], 'ts') or tostring(now))
  tokens = math.min(1, tokens + math.max(0, now - ts) * rate / 1000)
  if tokens < 1 then
    redis.call('HSET', KEYS[2], 'tokens', tostring(tokens), 'ts', now)
    redis.call('HINCRBY', KEYS[3], 'waits', 1)
    return {0, math.max(1, math.ceil((1 - tokens) * 1000 / rate)), 'rate'}
  end
  redis.call('HSET', KEYS[2], 'tokens', tostring(tokens - 1), 'ts', now)
end
redis.call('ZADD', KEYS[1], expiry, ARGV[1])
redis.call('HINCRBY', KEYS[3], 'calls', 1)
return {1, 0, 'ok'}
