-- Find the shard and position of the retained topic at an offset of the whole store
-- (shards in first-level order, topics in order within a shard), from per-shard counts:
-- no shard's topics are read.
-- KEYS[1] = the registry's shards sorted set (first levels, every score 0)
-- KEYS[2] = the registry's counts hash (first level -> topics stored or reserved)
-- ARGV[1] = the offset (0-based)
-- returns {shard, position within the shard}, or an empty array past the last topic
-- errors: ROUTER_INVALID (malformed ARGV or KEYS)
--! include keys

local wrong_keys = check_keys({false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 1 or not string.match(ARGV[1], '^[0-9]+$') or #ARGV[1] > 15 then
  return redis.error_reply('ROUTER_INVALID retained_locate takes a non-negative offset')
end
local offset = tonumber(ARGV[1])
local low = '-'
while true do
  local shards = redis.call('ZRANGEBYLEX', KEYS[1], low, '+', 'LIMIT', 0, 256)
  if #shards == 0 then
    return {}
  end
  local counts = redis.call('HMGET', KEYS[2], unpack(shards))
  for i, shard in ipairs(shards) do
    local count = tonumber(counts[i]) or 0
    if offset < count then
      return {shard, offset}
    end
    offset = offset - count
  end
  low = '(' .. shards[#shards]
end
