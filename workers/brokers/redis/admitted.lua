-- include: _shared.lua
-- Read only (keylane audit): a shard's admitted messages as the depth hash counts them,
-- beside the count of the lists that hold them (the truth the hash is kept by hand from:
-- every message in the list of a record that is not held).
-- KEYS: SHARD_KEYS of the shard (see _shared.lua), then the COMMON_KEYS (depth, held,
-- counters, backlog).
-- ARGV: shard, then record keys whose lists were found by a SCAN before this call (records
-- due or in flight are read here, at the same instant, so none admitted since is missed).
-- Returns {the depth hash's count, the lists' count}.
local K = shard_keys(0)
local records = {}
for i = 2, #ARGV do records[ARGV[i]] = true end
for _, key in ipairs(redis.call('ZRANGE', K.ready, 0, -1)) do records[key] = true end
for _, key in ipairs(redis.call('HKEYS', K.busy)) do records[key] = true end
local listed = 0
for key in pairs(records) do
  if redis.call('HEXISTS', K.held, key) == 0 then
    listed = listed + redis.call('LLEN', K.rec_prefix .. key)
  end
end
return {tonumber(redis.call('HGET', K.depth, ARGV[1]) or '0'), listed}
