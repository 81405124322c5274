-- Set a client's Topic Alias Maximum for one namespace; drop the aliases above it.
-- KEYS[1] = the namespace's alias hash (alias -> topic)
-- KEYS[2] = the namespace's reverse hash (topic -> alias)
-- KEYS[3] = the client's alias maximum hash (namespace -> Topic Alias Maximum)
-- ARGV[1] = the namespace ('client' or 'server')
-- ARGV[2] = the maximum (decimal, 0..65535; 0 forbids aliases)
-- returns the number of aliases dropped
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key holds
--         another type); nothing is changed then
--! include keys

local wrong_keys = check_keys({'hash', 'hash', 'hash'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 2 then
  return redis.error_reply('ROUTER_INVALID alias_maximum takes namespace, maximum')
end
local namespace, maximum = ARGV[1], ARGV[2]
if namespace ~= 'client' and namespace ~= 'server' then
  return redis.error_reply('ROUTER_INVALID the namespace must be client or server')
end
if not string.match(maximum, '^[0-9]+$') or #maximum > 5 or tonumber(maximum) > 65535 then
  return redis.error_reply('ROUTER_INVALID a maximum must be 0..65535')
end
local limit = tonumber(maximum)
local bound = redis.call('HGETALL', KEYS[1])
local dropped = 0
for i = 1, #bound, 2 do
  local value = tonumber(bound[i])
  if value == nil or value > limit then
    redis.call('HDEL', KEYS[1], bound[i])
    if redis.call('HGET', KEYS[2], bound[i + 1]) == bound[i] then
      redis.call('HDEL', KEYS[2], bound[i + 1])
    end
    dropped = dropped + 1
  end
end
redis.call('HSET', KEYS[3], namespace, tostring(limit))
return dropped
