-- Delete up to a limit of a shard's expired retained messages (Redis server time).
-- KEYS[1] = the shard's topics sorted set
-- KEYS[2] = the shard's messages hash
-- KEYS[3] = the shard's expiry sorted set (topic -> expiry time, server ms)
-- ARGV[1] = the most messages to delete (>= 1)
-- returns {deleted, freed}: the number of messages deleted and the bytes their packed
--         messages held
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key holds
--         another type); nothing is changed then
--! include keys

local wrong_keys = check_keys({'zset', 'hash', 'zset'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 1 or not string.match(ARGV[1], '^[1-9][0-9]*$') or #ARGV[1] > 12 then
  return redis.error_reply('ROUTER_INVALID retained_expire takes a positive limit')
end
local limit = tonumber(ARGV[1])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, limit)
local deleted = 0
local freed = 0
for _, topic in ipairs(expired) do
  freed = freed + redis.call('HSTRLEN', KEYS[2], topic)
  deleted = deleted + redis.call('HDEL', KEYS[2], topic)
  redis.call('ZREM', KEYS[1], topic)
  redis.call('ZREM', KEYS[3], topic)
end
return {deleted, freed}
