-- Claim the SQLite store's single-writer key, renew it when it is already ours, or take it
-- over from ARGV[3] (a holder known to be gone). KEYS: the claim (with a TTL), the last
-- holder (no TTL: deleted only by a graceful release). ARGV: holder, ttl ms, replacing.
-- A claim that ran out while its last holder never released it (paused, or on a host that
-- died) is not free: the caller is told who held it ({last, 'expired'}) and decides whether
-- that holder is gone. Returns {holder after the call, 'ok' | 'held' | 'expired'}.
local holder = redis.call('GET', KEYS[1])
if holder == false then
  local last = redis.call('GET', KEYS[2])
  if last and last ~= ARGV[1] and last ~= ARGV[3] then return {last, 'expired'} end
elseif holder ~= ARGV[1] and (ARGV[3] == '' or holder ~= ARGV[3]) then
  return {holder, 'held'}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('SET', KEYS[2], ARGV[1])
return {ARGV[1], 'ok'}
