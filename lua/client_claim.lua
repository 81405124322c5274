-- Make a node the owner of a client's session, with a new, larger epoch; for a fresh
-- session, remove what the client had before in the same step.
-- KEYS[1] = the client's subscriptions hash
-- KEYS[2] = the client's owner hash (fields node, epoch)
-- KEYS[3] = the client's inbound alias hash (alias -> topic), KEYS[4] = its reverse
-- KEYS[5] = the client's outbound alias hash (alias -> topic), KEYS[6] = its reverse
-- KEYS[7] = the client's alias maximum hash (namespace -> maximum)
-- KEYS[8] = the client's session hash (see router/state/session_store.py)
-- ARGV[1] = the id of the node that takes the session over
-- ARGV[2] = 'keep' (the session goes on with its stored state) or 'fresh' (subscriptions,
--           aliases and session description are deleted first)
-- ARGV[3] = the user name of the connecting client ('' for none; a single U+0000 for an empty
--           user name, which MQTT allows: no user name holds U+0000)
-- ARGV[4] = 'bound' (a session may be claimed only by the user its owner hash records,
--           '' for a client without one; an owner hash written before users were recorded
--           binds none) or 'shared' (any user may claim it); the hash records the claimer
-- ARGV[5] (optional) = 'open': in the same step, mark the session connected on the claiming
--           node as session_mark.lua's 'open' does (ARGV[6], ARGV[7], ... = field/value pairs
--           written into the session hash, then node, connected 1 and since; every key
--           persists): a clean start's claim and mark in one round trip
-- returns {previous owner node or false, previous epoch or false, new epoch as a decimal string,
--          the server time in milliseconds written as since (with 'open') or false}
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (stored epoch not an
--         integer; opening with keep, a session key that holds no hash), ROUTER_OTHER_USER
--         (bound to another user); nothing is changed then
--
-- The epoch is max(old epoch + 1, server time in microseconds): it grows with every claim,
-- and keeps growing after remove_client deleted the owner hash (the clock has moved on), so a
-- (node, epoch) pair from before can never match again.
--! include keys

local wrong_keys = check_keys({false, false, false, false, false, false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

local opening = #ARGV > 4
if #ARGV < 4 or ARGV[1] == '' or (ARGV[2] ~= 'keep' and ARGV[2] ~= 'fresh')
    or (ARGV[4] ~= 'bound' and ARGV[4] ~= 'shared')
    or (opening and (ARGV[5] ~= 'open' or #ARGV % 2 ~= 1)) then
  return redis.error_reply(
    'ROUTER_INVALID client_claim takes a non-empty node id, keep or fresh, a user, bound or '
    .. 'shared, and optionally open with field/value pairs')
end
local current = redis.call('HMGET', KEYS[2], 'node', 'epoch', 'user')
if ARGV[4] == 'bound' and current[3] and current[3] ~= ARGV[3] then
  return redis.error_reply('ROUTER_OTHER_USER the session belongs to another user')
end
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
if opening and ARGV[2] == 'keep' then  -- (the session hash is written after the owner's)
  local kind = redis.call('TYPE', KEYS[8])['ok']
  if kind ~= 'none' and kind ~= 'hash' then
    return redis.error_reply('ROUTER_CORRUPT the session key holds a ' .. kind .. ', not a hash')
  end
end
if ARGV[2] == 'fresh' then
  redis.call('DEL', KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
end
local text = string.format('%.0f', epoch)
redis.call('HSET', KEYS[2], 'node', ARGV[1], 'epoch', text, 'user', ARGV[3])
if not opening then
  return {current[1] or false, current[2] or false, text, false}
end
local now = string.format('%.0f', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[8], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[8], 'node', ARGV[1], 'connected', '1', 'since', now)
for i = 1, #KEYS do
  redis.call('PERSIST', KEYS[i])
end
return {current[1] or false, current[2] or false, text, now}
