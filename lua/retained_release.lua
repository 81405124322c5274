-- Give back the room of retained topics that were deleted (or never created).
-- KEYS[1] = the registry's shards sorted set (first levels, every score 0)
-- KEYS[2] = the registry's counts hash (first level -> topics stored or reserved)
-- KEYS[3] = the registry's total (topics stored or reserved in every shard)
-- ARGV[1] = a shard (first level), ARGV[2] = how many of its topics are released;
--           more shard, count pairs may follow
-- returns the new total
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key of another type, or
--         the total or a released shard's count is not an integer); nothing is changed then
--! include keys

local wrong_keys = check_keys({'zset', 'hash', 'string'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV % 2 ~= 0 then
  return redis.error_reply('ROUTER_INVALID retained_release takes shard, count pairs')
end
for i = 2, #ARGV, 2 do
  if not string.match(ARGV[i], '^[0-9]+$') or #ARGV[i] > 15 then
    return redis.error_reply('ROUTER_INVALID a released count must be a non-negative integer')
  end
end
-- Read and check everything before writing anything.
local stored = redis.call('GET', KEYS[3]) or '0'
if not string.match(stored, '^[0-9]+$') or #stored > 15 then
  return redis.error_reply('ROUTER_CORRUPT the stored retained total is not an integer')
end
local total = tonumber(stored)
for i = 1, #ARGV, 2 do
  local count = redis.call('HGET', KEYS[2], ARGV[i])
  if count and (not string.match(count, '^%-?[0-9]+$') or #count > 16) then
    return redis.error_reply('ROUTER_CORRUPT a stored retained count is not an integer')
  end
end
for i = 1, #ARGV, 2 do
  local released = tonumber(ARGV[i + 1])
  if released > 0 then
    local left = redis.call('HINCRBY', KEYS[2], ARGV[i], string.format('%.0f', -released))
    if left <= 0 then
      redis.call('HDEL', KEYS[2], ARGV[i])
      redis.call('ZREM', KEYS[1], ARGV[i])
    end
    total = math.max(total - released, 0)
  end
end
redis.call('SET', KEYS[3], string.format('%.0f', total))
return total
