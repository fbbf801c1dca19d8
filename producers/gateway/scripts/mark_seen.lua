-- Mark event ids seen, each after its message was confirmed (RabbitMQ), unless a concurrent
-- delivery marked it first, and count them: many requests' marks in one call.
-- KEYS = (counters, then one dedupe mark per event); ARGV = (the number of counts n, then n
-- pairs of counter field and amount, then a pair per mark: its value and retention ms).
local n = tonumber(ARGV[1])
for i = 1, n do
  redis.call('HINCRBY', KEYS[1], ARGV[2 * i], ARGV[2 * i + 1])
end
local first = 2 * n + 2
for k = 2, #KEYS do
  local at = first + 2 * (k - 2)
  redis.call('SET', KEYS[k], ARGV[at], 'PX', ARGV[at + 1], 'NX')
end
return #KEYS - 1
