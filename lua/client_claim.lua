-- Make a node the owner of a client's session, with a new, larger epoch.
-- KEYS[1] = the client's owner hash (fields node, epoch)
-- ARGV[1] = the id of the node that takes the session over
-- returns {previous owner node or false, new epoch as a decimal string}
-- errors: ROUTER_INVALID (missing or empty node id, malformed KEYS), ROUTER_CORRUPT (stored
--         epoch not an integer)
--
-- The epoch is max(old epoch + 1, server time in microseconds): it grows with every claim,
-- and keeps growing after remove_client deleted the owner hash (the clock has moved on), so a
-- (node, epoch) pair from before can never match again.
--! include keys

local wrong_keys = check_keys({false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 1 or ARGV[1] == '' then
  return redis.error_reply('ROUTER_INVALID client_claim takes exactly one non-empty node id')
end
local current = redis.call('HMGET', KEYS[1], 'node', 'epoch')
local time = redis.call('TIME')
local epoch = tonumber(time[1]) * 1000000 + tonumber(time[2])
if current[2] then
  local old = tonumber(current[2])
  if not string.match(current[2], '^[1-9][0-9]*$') or old >= 9007199254740991 then
    return redis.error_reply('ROUTER_CORRUPT the stored owner epoch is not an integer')
  end
  if old >= epoch then
    epoch = old + 1
  end
end
local text = string.format('%.0f', epoch)
redis.call('HSET', KEYS[1], 'node', ARGV[1], 'epoch', text)
return {current[1] or false, text}
