-- A plain Celery consumer took a shard message: put it back at the head of the shard
-- queue and ring the shard. KEYS: shard queue. ARGV: message, doorbell channel, shard.
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], ARGV[3])
return 1
