-- Read the position of a node's change stream and, when the route set is small, the
-- routes themselves (a large set is read in pages with HSCAN instead: no single call
-- walks all of it).
-- KEYS[1] = the node's routes hash (route -> member count)
-- KEYS[2] = the node's route change stream
-- KEYS[3] = the node's meta hash (incarnation, generation, version)
-- ARGV[1] = the most routes to return (decimal, >= 1)
-- returns {incarnation or false, generation or false, version, first version still in the
--         stream (0 if the stream is empty), number of routes, route1, count1, ...}
--         with every route when there are at most ARGV[1], none otherwise
--         (incarnation and generation are false when the node has no route set)
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (the stored version is not an integer)
--! include keys

local wrong_keys = check_keys({false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 1 or not string.match(ARGV[1], '^[1-9][0-9]*$') or #ARGV[1] > 9 then
  return redis.error_reply('ROUTER_INVALID route_snapshot takes the most routes to return (>= 1)')
end
local meta = redis.call('HMGET', KEYS[3], 'incarnation', 'generation', 'version')
local version = 0
if meta[3] then
  if not string.match(meta[3], '^[0-9]+$') or #meta[3] > 15 then
    return redis.error_reply('ROUTER_CORRUPT the stored route version is not an integer')
  end
  version = tonumber(meta[3])
end
local first = 0
local head = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
if #head > 0 then
  first = tonumber(string.match(head[1][1], '^([0-9]+)-')) or 0
end
local size = redis.call('HLEN', KEYS[1])
local result = {meta[1] or false, meta[2] or false, version, first, size}
if size > tonumber(ARGV[1]) then
  return result
end
local routes = redis.call('HGETALL', KEYS[1])
for i = 1, #routes do
  result[#result + 1] = routes[i]
end
return result
