-- include: _shared.lua
-- A lane is done with a record's messages: acknowledge them, count their outcomes, hold
-- the record behind a dead letter if asked, and (then_take) hand the lane the shard's next
-- due record: the same record's next message first. The lanes' Redis broker passes no
-- outcome or latency (it counts them, and the shard's drain count, in its process: see
-- keylane.routing.contract.tallies); what is passed is counted.
-- KEYS: SHARD_KEYS of the shard (see _shared.lua), then latency, and the COMMON_KEYS
-- (depth, held, counters, backlog).
-- ARGV: shard, lease value, record key, hold (dead letter id, '' for none), then_take
-- ('1'/'0'), admit, the outcomes channel, then per acknowledged message the values ACK
-- names (generated): message, outcome counter ('' counts nothing), conflicts, attempts,
-- latency bucket ('' none), latency seconds, the told outcome: its key ('' nothing told),
-- its JSON, its TTL in ms and whether it replaces ('1') a tell before it, and the source
-- whose backlog it leaves ('' none: it was not counted in at its accept). A told outcome
-- is kept and published on the channel in this same step (count_and_tell).
-- Returns 0 when the lease is not ours (nothing done), else 1, or with then_take the
-- record handed out (see take.lua), or {wait}: nothing is due, wait = ms until the
-- shard's first waiting record is due (-1: none waits).
local K = shard_keys(0)
local latency = KEYS[#SHARD_KEYS + 1]
local shard, lease, key, hold = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local then_take, admit_max = ARGV[5] == '1', tonumber(ARGV[6])
if redis.call('GET', K.lease) ~= lease then return 0 end
local now = nil  -- read only where needed (now_ms): an ack that hands nothing out reads no clock
local rec = K.rec_prefix .. key
local was_held = is_held(K, key)
local channel = ARGV[7]
for i = 8, #ARGV, ack_width() do
  local m = ARGV[i + ACK.message]
  if redis.call('LREM', rec, 1, m) == 1 and not was_held then
    redis.call('HINCRBY', K.depth, shard, -1)
  end
  forget(K.deliveries, redis.sha1hex(m))
  count_and_tell(K.counters, latency, channel, i, K.backlog)
end
redis.call('HDEL', K.busy, key)
local left = redis.call('LLEN', rec)
local holds = hold ~= '' and not was_held
if holds then
  -- The operator retried the row before it could hold the record (the retry was
  -- admitted behind, as an ordinary message): the retry goes first, nothing is held, as
  -- when admit meets the holding row's retry.
  local retry = retry_in(rec, hold)
  if retry then
    redis.call('LREM', rec, 1, retry)
    redis.call('LPUSH', rec, retry)
    holds = false
  end
end
if holds then
  if redis.call('HSETNX', K.held, key, hold) == 1 then
    memo(K).none_held = false
    redis.call('HINCRBY', K.depth, shard, -left)
    redis.call('HINCRBY', K.counters, 'held', 1)
  end
elseif left > 0 and not was_held then
  if then_take then
    admit(K, shard, now, admit_max)
    local got = hand_out(K, key, now)
    if got then return got end
  end
  redis.call('ZADD', K.ready, 'NX', now_ms(), key)
end
if then_take then
  admit(K, shard, now, admit_max)
  local got, wait = take_due(K, now)
  if got then return got end
  return {wait}
end
return 1
