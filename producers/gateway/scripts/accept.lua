-- include: _seen.lua
-- Accept deliveries' events, many deliveries in one call (a round of requests): for each
-- event, dedupe on the sender's event id and push to its shard queue; for each delivery
-- (one event, or the items of a batched delivery), all of its events or none of them
-- (invariant 1: a 2xx means every item is queued).
-- KEYS = (counters, depth, backlog, then per delivery: the scheduled run's lease or
-- counters again, then per event: its 0.1.x dedupe mark, queue, told outcome, the prefix
-- of its source's remembered ids); ARGV = (doorbell channel, shard high-water mark,
-- deliveries, global high-water mark, how long a told outcome is kept (ms; 0: a duplicate
-- is never queued again), then per
-- delivery: the run's lease value or '', its number of events, its source, its share of
-- the backlog (0: none), then per event: body hash, message, retention ms, shard, its
-- id's slot and field and its body's digest (_seen.lua)).
-- Returns one reply per delivery: {'fenced'} when its scheduled run no longer holds its
-- lease, {'full', event index, depth} when a shard is at its high-water mark (its queue,
-- what its owner admitted into records' lists, held records apart, and what this call
-- adds), {'throttled', its source's backlog} when its new events would take its source
-- past its share of the backlog while another source's events wait, {'overloaded', the
-- backlog} when they would take it past its share and the whole backlog past the global
-- mark (a source within its share is taken however long the others' backlog), else {'ok',
-- then per
-- event: verdict, the told outcome ('' while undecided)}:
-- 'accepted', 'duplicate' (the same id and body seen before, or earlier in this call),
-- 'retell' (a duplicate accepted longer ago than a told outcome is kept, and none is:
-- its message is queued again, and its lane, finding it in the journal, tells its
-- outcome anew; a duplicate when its shard is full) or 'reused' (another body). Each
-- event's answer is the caller's own (the same id and body give the same answer): it is
-- not sent here. A refused delivery leaves nothing behind; the others of the
-- call are not affected by it. Each accepted or retold event joins its source's backlog
-- (the hash source -> events accepted and not finished, finish.lua takes them off). The
-- verdicts are counted by the caller from these replies (keylane.routing.contract.tallies),
-- not here.
local high_water, shards, replies = tonumber(ARGV[2]), {}, {}
local told_keep_ms, t_ms = tonumber(ARGV[5]), now_ms()
local found = {}  -- mark key -> body hash of the first event of this call
local adding = {}  -- queue key -> events this call pushes to it
local backlog = nil  -- source -> events waiting (read once, when a share is asked about)
local global_high_water = tonumber(ARGV[4])
local k, a = 4, 6  -- where the next delivery starts in KEYS and in ARGV

-- What an earlier delivery's mark says of event i (KEYS from ki, ARGV from ai): nil (not
-- seen), else {verdict, told outcome}.
local function earlier(ki, ai)
  local window = tonumber(ARGV[ai + 2])
  local value = seen_find(KEYS[ki + 3], ARGV[ai + 4], ARGV[ai + 5], window, t_ms)
  local same, at = nil, nil
  if value then
    same, at = string.sub(value, 1, 8) == ARGV[ai + 6], seen_at_ms(value)
  else
    value = redis.call('GET', KEYS[ki])
    if not value then return nil end
    same = string.sub(value, 1, string.find(value, '\n', 1, true) - 1) == ARGV[ai]
    at = legacy_at_ms(KEYS[ki], window, t_ms)
  end
  if not same then return {'reused', ''} end
  local told = redis.call('GET', KEYS[ki + 2])
  if told then return {'duplicate', told} end
  local retell = told_keep_ms > 0 and t_ms - at > told_keep_ms
  return {retell and 'retell' or 'duplicate', ''}
end

-- The depth of event i's shard (KEYS from ki, ARGV from ai) with what this call adds.
local function depth_of(ki, ai, pending)
  local queue = KEYS[ki + 1]
  return redis.call('LLEN', queue) + (adding[queue] or 0) + (pending[queue] or 0)
    + tonumber(redis.call('HGET', KEYS[2], ARGV[ai + 3]) or '0')
end

-- The verdicts of one delivery's n events (KEYS from kk, ARGV from aa), or its refusal.
local function decide(kk, aa, n)
  local verdicts, pending, mine = {}, {}, {}
  for i = 1, n do
    local ki, ai = kk + 4 * (i - 1), aa + 7 * (i - 1)
    local here = mine[KEYS[ki]] or found[KEYS[ki]]
    if here then
      verdicts[i] = {here == ARGV[ai] and 'duplicate' or 'reused', ''}
    else
      verdicts[i] = earlier(ki, ai)
    end
    if not verdicts[i] or verdicts[i][1] == 'retell' then
      local queue, depth = KEYS[ki + 1], depth_of(ki, ai, pending)
      if verdicts[i] and depth >= high_water then
        verdicts[i][1] = 'duplicate'  -- told again by a later replay
      elseif verdicts[i] then
        pending[queue] = (pending[queue] or 0) + 1
      else
        if depth >= high_water then return nil, {'full', i, depth} end
        pending[queue] = (pending[queue] or 0) + 1
        mine[KEYS[ki]] = ARGV[ai]
        verdicts[i] = {'accepted', ''}
      end
    end
  end
  return verdicts
end

-- The source's backlog, the others', and the whole (negative counts, left by events that
-- were never counted in, count as none).
local function shares(source)
  if not backlog then
    backlog = {}
    local flat = redis.call('HGETALL', KEYS[3])
    for i = 1, #flat, 2 do backlog[flat[i]] = math.max(0, tonumber(flat[i + 1])) end
  end
  local others = 0
  for name, waiting in pairs(backlog) do
    if name ~= source then others = others + math.max(0, waiting) end
  end
  local mine = backlog[source] or 0
  return mine, others, mine + others
end

-- Count a delivery of source bringing n_new events into the backlog: nil when it is
-- taken (counted in), else {'throttled', its backlog} when it would take its source past
-- its share (limit) while others' events wait, {'overloaded', the backlog} past the global
-- mark (and then it is not counted in). The increment goes first: its reply is the
-- source's backlog, so a delivery within its share (the usual case) costs one command,
-- and the whole hash is read only when a share is passed.
local function count_in(source, limit, n_new)
  if n_new == 0 then return nil end
  local now = redis.call('HINCRBY', KEYS[3], source, n_new)
  if backlog then backlog[source] = now end
  if limit <= 0 then return nil end
  local mine = math.max(0, now - n_new)
  if mine + n_new <= limit then return nil end
  local _, others = shares(source)
  local refused = nil
  if mine + others + n_new > global_high_water then
    refused = {'overloaded', mine + others}
  elseif others > 0 then
    refused = {'throttled', mine}
  end
  if refused then backlog[source] = redis.call('HINCRBY', KEYS[3], source, -n_new) end
  return refused
end

for _ = 1, tonumber(ARGV[3]) do
  local lease_key, lease_value, n = KEYS[k], ARGV[a], tonumber(ARGV[a + 1])
  local source, limit = ARGV[a + 2], tonumber(ARGV[a + 3])
  local kk, aa = k + 1, a + 4
  k, a = kk + 4 * n, aa + 7 * n
  local verdicts, refused = nil, nil
  if lease_value ~= '' and redis.call('GET', lease_key) ~= lease_value then
    refused = {'fenced'}
  else
    verdicts, refused = decide(kk, aa, n)
    if not refused then
      local n_new = 0
      for i = 1, n do
        local verdict = verdicts[i][1]
        if verdict == 'accepted' or verdict == 'retell' then n_new = n_new + 1 end
      end
      refused = count_in(source, limit, n_new)
    end
  end
  if refused then
    replies[#replies + 1] = refused
  else
    local reply = {'ok'}
    for i = 1, n do
      local ki, ai = kk + 4 * (i - 1), aa + 7 * (i - 1)
      local verdict = verdicts[i][1]
      if verdict == 'accepted' or verdict == 'retell' then
        redis.call('LPUSH', KEYS[ki + 1], ARGV[ai + 1])
        adding[KEYS[ki + 1]] = (adding[KEYS[ki + 1]] or 0) + 1
        shards[ARGV[ai + 3]] = true
      end
      if verdict == 'accepted' then
        seen_mark(KEYS[ki + 3], ARGV[ai + 4], ARGV[ai + 5], ARGV[ai + 6], tonumber(ARGV[ai + 2]), t_ms)
        found[KEYS[ki]] = ARGV[ai]
      end
      reply[#reply + 1] = verdict
      reply[#reply + 1] = verdicts[i][2]
    end
    replies[#replies + 1] = reply
  end
end
for shard in pairs(shards) do redis.call('PUBLISH', ARGV[1], shard) end
return replies
