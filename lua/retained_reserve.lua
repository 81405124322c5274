-- Reserve room for one new retained topic in the registry, unless the store is full.
-- KEYS[1] = the registry's shards sorted set (first levels, every score 0)
-- KEYS[2] = the registry's counts hash (first level -> topics stored or reserved)
-- KEYS[3] = the registry's total (topics stored or reserved in every shard)
-- ARGV[1] = the shard: the new topic's first level (may be '')
-- ARGV[2] = the most topics the store may hold, '0' for no limit
-- returns 1 if the room was reserved (the shard is registered), 0 if the store is full
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key of another type, or
--         the total or the shard's count is not an integer); nothing is changed then
--! include keys

local wrong_keys = check_keys({'zset', 'hash', 'string'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 2 or not string.match(ARGV[2], '^[0-9]+$') or #ARGV[2] > 15 then
  return redis.error_reply('ROUTER_INVALID retained_reserve takes a shard and a limit')
end
local most = tonumber(ARGV[2])
-- Read and check everything before writing anything.
local stored = redis.call('GET', KEYS[3]) or '0'
if not string.match(stored, '^[0-9]+$') or #stored > 15 then
  return redis.error_reply('ROUTER_CORRUPT the stored retained total is not an integer')
end
local total = tonumber(stored)
local count = redis.call('HGET', KEYS[2], ARGV[1])
if count and (not string.match(count, '^%-?[0-9]+$') or #count > 16) then
  return redis.error_reply('ROUTER_CORRUPT the stored retained count is not an integer')
end
if most > 0 and total >= most then
  return 0
end
redis.call('INCR', KEYS[3])
redis.call('HINCRBY', KEYS[2], ARGV[1], 1)
redis.call('ZADD', KEYS[1], 0, ARGV[1])
return 1
