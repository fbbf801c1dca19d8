-- Queue one review message per distinct body sent under a reused event id.
-- KEYS = (the body's reuse mark, queue); ARGV = (retention ms, message, doorbell channel,
-- shard). Returns 1 when queued, 0 when this body was recorded before.
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then
  redis.call('LPUSH', KEYS[2], ARGV[2])
  redis.call('PUBLISH', ARGV[3], ARGV[4])
  return 1
end
return 0
