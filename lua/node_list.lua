-- List the registered nodes with their heartbeat expiry, and the server time, in one view.
-- KEYS[1] = the registry hash (node id -> incarnation)
-- KEYS[2] = the heartbeat sorted set (node id scored by expiry, server time in ms)
-- KEYS[3] = the retired hash (node id -> the incarnation that retired)
-- ARGV: none
-- returns {server time in ms, node1, incarnation1, expiry1, retired1, node2, ...} (expiry '0'
--         when the node has no heartbeat; retired 1 when its registered incarnation retired, else
--         0); a node is alive while it is not retired and its expiry is later than the time
-- errors: ROUTER_INVALID (ARGV given, malformed KEYS)
--! include keys

local wrong_keys = check_keys({false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 0 then
  return redis.error_reply('ROUTER_INVALID node_list takes no arguments')
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local result = {string.format('%.0f', now)}
local registry = redis.call('HGETALL', KEYS[1])
for i = 1, #registry, 2 do
  result[#result + 1] = registry[i]
  result[#result + 1] = registry[i + 1]
  result[#result + 1] = redis.call('ZSCORE', KEYS[2], registry[i]) or '0'
  result[#result + 1] = redis.call('HGET', KEYS[3], registry[i]) == registry[i + 1] and 1 or 0
end
return result
