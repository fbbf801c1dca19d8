-- The remembered event ids (RedisKeys.seen_ids in routing/redis_keys.py): an id is found
-- in the hash of its slot in each period of its window, newest first, or remembered in
-- the hash of its slot in the period of now. A hash's field is the id's digest, its value
-- the body's digest (8 bytes) then when the id was accepted (4 bytes, s since the epoch,
-- big-endian); the hash expires whole once its period's last id is past its window.
-- Ids marked by keylane up to 0.1.x (one key an id, RedisKeys.dedupe) are read until
-- they expire: such a value is the body's hex digest, a newline, the first answer.

-- Redis's clock, in ms (one clock for every receiver: a period is the same for all).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- When a remembered id (its value) was accepted, in ms, to the second below it (its
-- window is counted from the second above: an id is never forgotten early).
local function seen_at_ms(value)
  return struct.unpack('>I4', value, 9) * 1000
end

-- The value remembered for an id within window_ms of now (nil: none). Newest first: an
-- id found past its window is not looked for in older periods.
local function seen_find(prefix, slot, field, window_ms, now)
  local newest = math.floor(now / SEEN_PERIOD_MS)
  local oldest = math.floor((now - window_ms - 1000) / SEEN_PERIOD_MS)
  for period = newest, oldest, -1 do
    local value = redis.call('HGET', prefix .. string.format('%d:%s', period, slot), field)
    if value then
      if now - seen_at_ms(value) - 1000 < window_ms then return value end
      return nil
    end
  end
  return nil
end

-- Remember an id (body: its body's 8-byte digest) for window_ms from now: its hash is
-- kept at least until its period's last id is past its window (never shortened, should
-- another receiver have another window for the source).
local function seen_mark(prefix, slot, field, body, window_ms, now)
  local period = math.floor(now / SEEN_PERIOD_MS)
  local key = prefix .. string.format('%d:%s', period, slot)
  redis.call('HSET', key, field, body .. struct.pack('>I4', math.floor(now / 1000)))
  local until_ms = (period + 1) * SEEN_PERIOD_MS + window_ms + 1000
  if redis.call('PTTL', key) < until_ms - now then
    redis.call('PEXPIREAT', key, string.format('%d', until_ms))
  end
end

-- When an id marked by keylane up to 0.1.x (its key) was accepted, in ms, from what is
-- left of its TTL (set to window_ms when it was marked).
local function legacy_at_ms(key, window_ms, now)
  return now - (window_ms - math.max(0, redis.call('PTTL', key)))
end
