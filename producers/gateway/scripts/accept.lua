-- Dedupe on the sender's event id and push to the shard queue, or neither (invariant 1):
-- KEYS = (dedupe mark, queue, counters, depth, told outcome); ARGV = (body hash, message,
-- answer, retention ms, high-water mark, doorbell channel, shard, keyless flag). The
-- shard's depth is its queue and what its owner admitted into records' lists (held
-- records apart). A duplicate gets the first answer and, once its lane decided the event,
-- the told outcome (read in this same step; '' while undecided).
local seen = redis.call('GET', KEYS[1])
if seen then
  local sep = string.find(seen, '\n', 1, true)
  if string.sub(seen, 1, sep - 1) == ARGV[1] then
    redis.call('HINCRBY', KEYS[3], 'duplicate_deliveries', 1)
    return {'duplicate', string.sub(seen, sep + 1), redis.call('GET', KEYS[5]) or ''}
  end
  redis.call('HINCRBY', KEYS[3], 'reused_ids', 1)
  return {'reused', string.sub(seen, sep + 1)}
end
local depth = redis.call('LLEN', KEYS[2]) + tonumber(redis.call('HGET', KEYS[4], ARGV[7]) or '0')
if depth >= tonumber(ARGV[5]) then
  redis.call('HINCRBY', KEYS[3], 'refused_full', 1)
  return {'full', tostring(depth)}
end
redis.call('LPUSH', KEYS[2], ARGV[2])
redis.call('SET', KEYS[1], ARGV[1] .. '\n' .. ARGV[3], 'PX', ARGV[4])
redis.call('PUBLISH', ARGV[6], ARGV[7])
redis.call('HINCRBY', KEYS[3], 'accepted', 1)
if ARGV[8] == '1' then redis.call('HINCRBY', KEYS[3], 'keyless', 1) end
return {'accepted', ARGV[3]}
