-- include: _shared.lua
-- Take the next due record of the first candidate shard that has one.
-- KEYS: SHARD_KEYS per candidate shard (see _shared.lua), then the COMMON_KEYS (depth,
-- held, counters, backlog).
-- ARGV: admit (messages each shard admits first), then per shard: its number, the lease
-- value this worker holds. A shard whose lease value differs is skipped: another worker's
-- shards are never taken from.
-- Returns {i, record key, message, deliveries, held, batch, next due} (i: the candidate's
-- index; next due: ms until the shard's earliest other record is due, see next_due), or
-- {0, wait_1, ..., wait_n}: per candidate, ms until its first waiting record is due
-- (-1: none waits, -2: not our lease).
local now = now_ms()
local admit_max = tonumber(ARGV[1])
local waits = {0}
for i = 1, (#ARGV - 1) / 2 do
  local K = shard_keys((i - 1) * #SHARD_KEYS)
  local shard, lease = ARGV[2 * i], ARGV[2 * i + 1]
  if redis.call('GET', K.lease) == lease then
    admit(K, shard, now, admit_max)
    local got, wait = take_due(K, now)
    if got then
      table.insert(got, 1, i)
      return got
    end
    waits[#waits + 1] = wait
  else
    waits[#waits + 1] = -2
  end
end
return waits
