-- Read the retained messages of one shard by position (topic order), for pages.
-- KEYS[1] = the shard's topics sorted set (every score 0: ordered by topic bytes)
-- KEYS[2] = the shard's messages hash (topic -> packed message)
-- KEYS[3] = the shard's expiry sorted set (topic -> expiry time, server ms)
-- ARGV[1] = the position of the first topic (0-based)
-- ARGV[2] = how many positions to read (1..10000)
-- returns {size, ...}: size is the number of topics in the shard, then a flat list of
--   topic, packed message, ms to expiry (-1: never) per position read; expired messages
--   keep their position but are left out
-- errors: ROUTER_INVALID (malformed ARGV or KEYS)
--! include keys

local wrong_keys = check_keys({false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 2 or not string.match(ARGV[1], '^[0-9]+$') or #ARGV[1] > 15
    or not string.match(ARGV[2], '^[1-9][0-9]*$') or #ARGV[2] > 5 or tonumber(ARGV[2]) > 10000 then
  return redis.error_reply('ROUTER_INVALID retained_range takes a position and a count')
end
local first = tonumber(ARGV[1])
local count = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local result = {redis.call('ZCARD', KEYS[1])}
for _, topic in ipairs(redis.call('ZRANGE', KEYS[1], first, first + count - 1)) do
  local message = redis.call('HGET', KEYS[2], topic)
  local expires = redis.call('ZSCORE', KEYS[3], topic)
  local left = -1
  if expires then
    left = math.max(tonumber(expires) - now, 0)
  end
  if message and left ~= 0 then
    result[#result + 1] = topic
    result[#result + 1] = message
    result[#result + 1] = left
  end
end
return result
