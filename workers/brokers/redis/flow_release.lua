-- A call ended: free its slot, count its outcome, (after a Retry-After) pause the
-- destination for every worker, and adapt its rate (AIMD, shared by every worker):
-- * a throttled call (429, or a Retry-After pause) lowers the rate to 0.9 x the calls the
--   destination admitted in the last second (what it takes), at most 0.9 x the rate in
--   force (half of it when nothing was admitted), never below 0.1/s. Only a call started
--   after the last cut cuts again (both timed to the microsecond): the calls in flight when
--   the destination began to refuse all answer for the same excess.
-- * each call that succeeds raises the adapted rate a little: by max(0.05, 1 % of the rate
--   of the last cut) calls/s over a second of successful calls, so a 10 % cut is made up in
--   about 10 s; past the configured rate (or, with none, twice the rate of the last cut)
--   the destination runs at its configured limits again.
-- KEYS = (calls, bucket, counters, admitted: a sorted set of the last second's successful
-- calls); ARGV = (slot, outcome counter, pause ms (0: none), throttled (1/0), slot ttl ms,
-- adaptive (1/0)). Returns the new rate (text) when it was cut, else ''.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- When the call started and when a cut is made, to the microsecond (a slot's expiry is
-- kept so by FLOW_ACQUIRE): a whole burst of calls can fit in one millisecond.
local precise = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local expiry = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
local started = precise
if expiry > 0 then started = expiry - tonumber(ARGV[5]) end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
local pause = tonumber(ARGV[3])
if pause > 0 then
  local paused = tonumber(redis.call('HGET', KEYS[2], 'paused') or '0')
  if now + pause > paused then redis.call('HSET', KEYS[2], 'paused', now + pause) end
end
if ARGV[6] ~= '1' then return '' end
local configured = tonumber(redis.call('HGET', KEYS[2], 'rate') or '0')
local adapted = tonumber(redis.call('HGET', KEYS[2], 'adapted') or '0')
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - 1000)
if ARGV[4] == '1' then
  if started <= tonumber(redis.call('HGET', KEYS[2], 'cut_at') or '0') then return '' end
  local current = configured
  if adapted > 0 and (current == 0 or adapted < current) then current = adapted end
  local admitted = redis.call('ZCARD', KEYS[4])
  local new = 1
  if admitted > 0 then
    new = 0.9 * admitted
    if current > 0 then new = math.min(new, 0.9 * current) end
  elseif current > 0 then
    new = 0.5 * current
  end
  new = math.max(0.1, new)
  local cut_at = string.format('%.3f', precise)
  redis.call('HSET', KEYS[2], 'adapted', tostring(new), 'cut_rate', tostring(new), 'cut_at', cut_at)
  redis.call('HINCRBY', KEYS[3], 'rate_cuts', 1)
  return tostring(new)
end
if ARGV[2] == 'done' then
  redis.call('ZADD', KEYS[4], now, ARGV[1] .. '@' .. now)
  redis.call('PEXPIRE', KEYS[4], 2000)
  if adapted > 0 then
    local cut_rate = tonumber(redis.call('HGET', KEYS[2], 'cut_rate') or tostring(adapted))
    adapted = adapted + math.max(0.05, 0.01 * cut_rate) / adapted
    local ceiling = configured
    if ceiling == 0 then ceiling = 2 * cut_rate end
    if adapted >= ceiling then
      redis.call('HDEL', KEYS[2], 'adapted', 'cut_rate')
    else
      redis.call('HSET', KEYS[2], 'adapted', tostring(adapted))
    end
  end
end
return ''
