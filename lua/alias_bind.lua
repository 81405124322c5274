-- Bind a topic alias to a topic in one of a client's alias namespaces.
-- KEYS[1] = the namespace's alias hash (alias -> topic)
-- KEYS[2] = the namespace's reverse hash (topic -> alias)
-- KEYS[3] = the client's alias maximum hash (namespace -> Topic Alias Maximum)
-- ARGV[1] = the namespace ('client' or 'server')
-- ARGV[2] = the alias (decimal, 1..the namespace's maximum, 65535 if none was set)
-- ARGV[3] = the topic name
-- returns 1 if the binding changed, 0 if the alias already stood for the topic
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_BAD_ALIAS <alias> <reason> (out of range),
--         ROUTER_CORRUPT (a stored maximum is not an integer); nothing is changed then
--
-- Both directions stay consistent: the alias's old topic and the topic's old alias are forgotten.
--! include keys

local wrong_keys = check_keys({false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 3 then
  return redis.error_reply('ROUTER_INVALID alias_bind takes namespace, alias, topic')
end
local namespace, alias, topic = ARGV[1], ARGV[2], ARGV[3]
if namespace ~= 'client' and namespace ~= 'server' then
  return redis.error_reply('ROUTER_INVALID the namespace must be client or server')
end
if #topic == 0 or #topic > 65535 then
  return redis.error_reply('ROUTER_INVALID a topic must be 1..65535 bytes')
end
if not string.match(alias, '^[1-9][0-9]*$') or #alias > 5 then
  return redis.error_reply('ROUTER_BAD_ALIAS ' .. alias .. ' an alias must be between 1 and 65535')
end
local maximum = 65535
local stored = redis.call('HGET', KEYS[3], namespace)
if stored then
  if not string.match(stored, '^[0-9]+$') or tonumber(stored) > 65535 then
    return redis.error_reply('ROUTER_CORRUPT the stored alias maximum is not 0..65535')
  end
  maximum = tonumber(stored)
end
if tonumber(alias) > maximum then
  return redis.error_reply(
    'ROUTER_BAD_ALIAS ' .. alias .. ' an alias must be between 1 and ' .. maximum)
end
local old_topic = redis.call('HGET', KEYS[1], alias)
if old_topic == topic then
  return 0
end
if old_topic then
  redis.call('HDEL', KEYS[2], old_topic)
end
local old_alias = redis.call('HGET', KEYS[2], topic)
if old_alias then
  redis.call('HDEL', KEYS[1], old_alias)
end
redis.call('HSET', KEYS[1], alias, topic)
redis.call('HSET', KEYS[2], topic, alias)
return 1
