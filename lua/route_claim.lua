-- Start a node's route set afresh for an incarnation: drop whatever was there (routes of a
-- previous incarnation, or of this one before a republish) and store the given routes.
-- KEYS[1] = the node's routes hash (route -> member count)
-- KEYS[2] = the node's route change stream
-- KEYS[3] = the node's meta hash (incarnation, generation, version)
-- ARGV[1] = the incarnation id of the node process that claims the route set
-- ARGV[2], ARGV[3], ... = route, member count pairs (count >= 1): the initial route set
-- returns {new generation (decimal string), number of routes dropped}
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (stored generation not an integer);
--         nothing is changed then
--
-- The generation is max(old generation + 1, server time in microseconds), so it changes on
-- every claim, even after a purge or a Redis restart: readers holding an older generation
-- learn that they must take a new snapshot. The change stream restarts empty at version 0.
--! include keys

local wrong_keys = check_keys({false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

local n = #ARGV
if n < 1 or n % 2 ~= 1 or ARGV[1] == '' then
  return redis.error_reply('ROUTER_INVALID route_claim takes incarnation, route/count pairs')
end
for i = 2, n, 2 do
  if #ARGV[i] == 0 or #ARGV[i] > 65535 then
    return redis.error_reply('ROUTER_INVALID a route must be 1..65535 bytes')
  end
  if not string.match(ARGV[i + 1], '^[1-9][0-9]*$') or #ARGV[i + 1] > 15 then
    return redis.error_reply('ROUTER_INVALID a claimed route needs a count >= 1')
  end
end
local old = redis.call('HGET', KEYS[3], 'generation')
local time = redis.call('TIME')
local generation = tonumber(time[1]) * 1000000 + tonumber(time[2])
if old then
  local previous = tonumber(old)
  if not string.match(old, '^[1-9][0-9]*$') or previous >= 9007199254740991 then
    return redis.error_reply('ROUTER_CORRUPT the stored route generation is not an integer')
  end
  if previous >= generation then
    generation = previous + 1
  end
end
local dropped = redis.call('HLEN', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
for i = 2, n, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
local text = string.format('%.0f', generation)
redis.call('HSET', KEYS[3], 'incarnation', ARGV[1], 'generation', text, 'version', '0')
return {text, dropped}
