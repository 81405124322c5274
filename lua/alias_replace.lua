-- Replace a client's topic aliases (both namespaces) with one connection's tables, or forget
-- them, for the node that owns the client's session under the epoch it holds.
-- KEYS[1] = the client's owner hash (fields node, epoch)
-- KEYS[2] = the inbound ('client') alias hash (alias -> topic), KEYS[3] = its reverse
-- KEYS[4] = the outbound ('server') alias hash (alias -> topic), KEYS[5] = its reverse
-- KEYS[6] = the client's alias maximum hash (namespace -> Topic Alias Maximum)
-- ARGV[1] = the owner node id the caller writes for (not empty)
-- ARGV[2] = the owner epoch the caller holds (decimal)
-- ARGV[3] = 'set' (the tables follow) or 'forget' (nothing follows: every alias key is deleted)
-- with 'set':
-- ARGV[4] = the inbound maximum, ARGV[5] = the outbound maximum (decimal, 0..65535)
-- ARGV[6] = n, the number of inbound bindings
-- ARGV[7], ARGV[8], ... = n inbound alias / topic pairs, then the outbound alias / topic pairs
--           (each alias 1..its namespace's maximum, each topic 1..65535 bytes, neither twice
--           in one namespace)
-- returns the number of bindings stored (0 with 'forget')
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_NOT_OWNER (another owner or epoch,
--         or none), ROUTER_CORRUPT (the stored epoch is not an integer, a key holds another
--         type); nothing is changed then
--
-- The owner check fences the write: a connection's node that lost the session to a newer
-- claim (a takeover on another node) can neither write nor forget the new connection's aliases.
--! include owner
--! include keys

local wrong_keys = check_keys({false, 'hash', 'hash', 'hash', 'hash', 'hash'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV < 3 or ARGV[1] == '' or (ARGV[3] ~= 'set' and ARGV[3] ~= 'forget') then
  return redis.error_reply('ROUTER_INVALID alias_replace takes node, epoch, set or forget, ...')
end
local refused = check_owner(KEYS[1], ARGV[1], ARGV[2])
if refused then
  return redis.error_reply(refused)
end
if ARGV[3] == 'forget' then
  if #ARGV ~= 3 then
    return redis.error_reply('ROUTER_INVALID forget takes nothing more')
  end
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
  return 0
end

local function number(text, most)
  if not string.match(text, '^[0-9]+$') or #text > 5 or tonumber(text) > most then
    return nil
  end
  return tonumber(text)
end

if #ARGV < 6 or #ARGV % 2 ~= 0 then
  return redis.error_reply('ROUTER_INVALID set takes two maximums, a count and pairs')
end
local maximums = {number(ARGV[4], 65535), number(ARGV[5], 65535)}
local inbound = number(ARGV[6], 65535)
if not maximums[1] or not maximums[2] or not inbound or 6 + 2 * inbound > #ARGV then
  return redis.error_reply('ROUTER_INVALID the maximums and the count must be 0..65535')
end
local seen = {{}, {}}
for i = 7, #ARGV, 2 do
  local space = (i < 7 + 2 * inbound) and 1 or 2
  local alias, topic = number(ARGV[i], maximums[space]), ARGV[i + 1]
  if not alias or alias == 0 or #topic == 0 or #topic > 65535 then
    return redis.error_reply('ROUTER_INVALID an alias is 1..its maximum, a topic 1..65535 bytes')
  end
  if seen[space]['a' .. alias] or seen[space]['t' .. topic] then
    return redis.error_reply('ROUTER_INVALID an alias or a topic is given twice')
  end
  seen[space]['a' .. alias] = true
  seen[space]['t' .. topic] = true
end

redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
for i = 7, #ARGV, 2 do
  local space = (i < 7 + 2 * inbound) and 0 or 2
  local alias = tostring(tonumber(ARGV[i]))
  redis.call('HSET', KEYS[2 + space], alias, ARGV[i + 1])
  redis.call('HSET', KEYS[3 + space], ARGV[i + 1], alias)
end
redis.call('HSET', KEYS[6], 'client', tostring(maximums[1]), 'server', tostring(maximums[2]))
return (#ARGV - 6) / 2
