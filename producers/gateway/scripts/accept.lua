-- Accept one delivery's events (one, or the items of a batched delivery): for each, dedupe
-- on the sender's event id and push to its shard queue, or, for the delivery as a whole,
-- nothing at all (invariant 1: a 2xx means every item is queued).
-- KEYS = (counters, depth, the scheduled run's lease or counters again, then per event:
-- dedupe mark, queue, told outcome); ARGV = (doorbell channel, high-water mark, the run's
-- lease value or '', then per event: body hash, message, answer, retention ms, shard,
-- keyless flag). A scheduled run that no longer holds its lease accepts nothing
-- ({'fenced'}); a shard at its high-water mark (its queue and what its owner admitted into
-- records' lists, held records apart, and what this delivery adds) refuses the delivery
-- ({'full', event index, depth}). Otherwise {'ok', then per event: verdict, the first
-- delivery's answer, the told outcome ('' while undecided)}: 'accepted', 'duplicate' (the
-- same id and body seen before, or earlier in this delivery) or 'reused' (another body).
if ARGV[3] ~= '' and redis.call('GET', KEYS[3]) ~= ARGV[3] then return {'fenced'} end
local n = (#KEYS - 3) / 3
local found = {}  -- mark key -> the value a dedupe mark holds, for events of this delivery
local adding = {}  -- queue key -> events this delivery pushes to it
local verdicts = {}
for i = 1, n do
  local k, a = 3 * i + 1, 6 * i - 2
  local seen = found[KEYS[k]] or redis.call('GET', KEYS[k])
  if seen then
    local sep = string.find(seen, '\n', 1, true)
    local told = found[KEYS[k]] and '' or (redis.call('GET', KEYS[k + 2]) or '')
    verdicts[i] = {string.sub(seen, 1, sep - 1) == ARGV[a] and 'duplicate' or 'reused',
                   string.sub(seen, sep + 1), told}
  else
    local queue = KEYS[k + 1]
    local depth = redis.call('LLEN', queue) + (adding[queue] or 0)
      + tonumber(redis.call('HGET', KEYS[2], ARGV[a + 4]) or '0')
    if depth >= tonumber(ARGV[2]) then
      redis.call('HINCRBY', KEYS[1], 'refused_full', 1)
      return {'full', i, depth}
    end
    adding[queue] = (adding[queue] or 0) + 1
    found[KEYS[k]] = ARGV[a] .. '\n' .. ARGV[a + 2]
    verdicts[i] = {'accepted', ARGV[a + 2], ''}
  end
end
local counts, shards, reply = {}, {}, {'ok'}
for i = 1, n do
  local k, a = 3 * i + 1, 6 * i - 2
  local verdict = verdicts[i][1]
  if verdict == 'accepted' then
    redis.call('LPUSH', KEYS[k + 1], ARGV[a + 1])
    redis.call('SET', KEYS[k], ARGV[a] .. '\n' .. ARGV[a + 2], 'PX', ARGV[a + 3])
    shards[ARGV[a + 4]] = true
    if ARGV[a + 5] == '1' then counts.keyless = (counts.keyless or 0) + 1 end
  end
  local counter = verdict == 'accepted' and 'accepted'
    or (verdict == 'duplicate' and 'duplicate_deliveries' or 'reused_ids')
  counts[counter] = (counts[counter] or 0) + 1
  reply[#reply + 1] = verdict
  reply[#reply + 1] = verdicts[i][2]
  reply[#reply + 1] = verdicts[i][3]
end
for counter, amount in pairs(counts) do redis.call('HINCRBY', KEYS[1], counter, amount) end
for shard in pairs(shards) do redis.call('PUBLISH', ARGV[1], shard) end
return reply
