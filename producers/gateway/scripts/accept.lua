-- Accept deliveries' events, many deliveries in one call (a round of requests): for each
-- event, dedupe on the sender's event id and push to its shard queue; for each delivery
-- (one event, or the items of a batched delivery), all of its events or none of them
-- (invariant 1: a 2xx means every item is queued).
-- KEYS = (counters, depth, then per delivery: the scheduled run's lease or counters again,
-- then per event: dedupe mark, queue, told outcome); ARGV = (doorbell channel, high-water
-- mark, deliveries, then per delivery: the run's lease value or '', its number of events,
-- then per event: body hash, message, answer, retention ms, shard, keyless flag).
-- Returns one reply per delivery: {'fenced'} when its scheduled run no longer holds its
-- lease, {'full', event index, depth} when a shard is at its high-water mark (its queue,
-- what its owner admitted into records' lists, held records apart, and what this call
-- adds), else {'ok', then per event: verdict, the first delivery's answer, the told
-- outcome ('' while undecided)}: 'accepted', 'duplicate' (the same id and body seen
-- before, or earlier in this call) or 'reused' (another body). A refused delivery leaves
-- nothing behind; the others of the call are not affected by it.
local high_water, counts, shards, replies = tonumber(ARGV[2]), {}, {}, {}
local found = {}  -- mark key -> the value a dedupe mark holds, for events of this call
local adding = {}  -- queue key -> events this call pushes to it
local k, a = 3, 4  -- where the next delivery starts in KEYS and in ARGV

local function count(counter, amount)
  counts[counter] = (counts[counter] or 0) + amount
end

-- The verdicts of one delivery's n events (KEYS from kk, ARGV from aa), or its refusal.
local function decide(kk, aa, n)
  local verdicts, pending, mine = {}, {}, {}
  for i = 1, n do
    local ki, ai = kk + 3 * (i - 1), aa + 6 * (i - 1)
    local here = mine[KEYS[ki]] or found[KEYS[ki]]
    local seen = here or redis.call('GET', KEYS[ki])
    if seen then
      local sep = string.find(seen, '\n', 1, true)
      local told = here and '' or (redis.call('GET', KEYS[ki + 2]) or '')
      verdicts[i] = {string.sub(seen, 1, sep - 1) == ARGV[ai] and 'duplicate' or 'reused',
                     string.sub(seen, sep + 1), told}
    else
      local queue = KEYS[ki + 1]
      local depth = redis.call('LLEN', queue) + (adding[queue] or 0) + (pending[queue] or 0)
        + tonumber(redis.call('HGET', KEYS[2], ARGV[ai + 4]) or '0')
      if depth >= high_water then return nil, {'full', i, depth} end
      pending[queue] = (pending[queue] or 0) + 1
      mine[KEYS[ki]] = ARGV[ai] .. '\n' .. ARGV[ai + 2]
      verdicts[i] = {'accepted', ARGV[ai + 2], ''}
    end
  end
  return verdicts
end

for _ = 1, tonumber(ARGV[3]) do
  local lease_key, lease_value, n = KEYS[k], ARGV[a], tonumber(ARGV[a + 1])
  local kk, aa = k + 1, a + 2
  k, a = kk + 3 * n, aa + 6 * n
  if lease_value ~= '' and redis.call('GET', lease_key) ~= lease_value then
    replies[#replies + 1] = {'fenced'}
  else
    local verdicts, refused = decide(kk, aa, n)
    if refused then
      count('refused_full', 1)
      replies[#replies + 1] = refused
    else
      local reply = {'ok'}
      for i = 1, n do
        local ki, ai = kk + 3 * (i - 1), aa + 6 * (i - 1)
        local verdict = verdicts[i][1]
        if verdict == 'accepted' then
          local mark = ARGV[ai] .. '\n' .. ARGV[ai + 2]
          redis.call('LPUSH', KEYS[ki + 1], ARGV[ai + 1])
          redis.call('SET', KEYS[ki], mark, 'PX', ARGV[ai + 3])
          found[KEYS[ki]] = mark
          adding[KEYS[ki + 1]] = (adding[KEYS[ki + 1]] or 0) + 1
          shards[ARGV[ai + 4]] = true
          if ARGV[ai + 5] == '1' then count('keyless', 1) end
          count('accepted', 1)
        else
          count(verdict == 'duplicate' and 'duplicate_deliveries' or 'reused_ids', 1)
        end
        reply[#reply + 1] = verdict
        reply[#reply + 1] = verdicts[i][2]
        reply[#reply + 1] = verdicts[i][3]
      end
      replies[#replies + 1] = reply
    end
  end
end
for counter, amount in pairs(counts) do redis.call('HINCRBY', KEYS[1], counter, amount) end
for shard in pairs(shards) do redis.call('PUBLISH', ARGV[1], shard) end
return replies
