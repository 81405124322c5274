-- Read a node's route changes after the version a reader has applied.
-- KEYS[1] = the node's route change stream (entry id VERSION-0, fields r = route, n = count)
-- KEYS[2] = the node's meta hash (incarnation, generation, version)
-- ARGV[1] = the generation the reader's snapshot came from ('' if there was no route set)
-- ARGV[2] = the last version the reader applied (decimal, >= 0)
-- ARGV[3] = the most changes to return (>= 1)
-- returns {'ok', current version, version1, route1, count1, version2, ...} with the changes
--         right after ARGV[2] in order, or {'resync', reason} when the reader cannot continue:
--         'gone' (no route set anymore: purged, or Redis lost it), 'generation' (the route set
--         was claimed again), 'ahead' (the reader's version was never reached), 'trimmed'
--         (the next change was trimmed from the stream, or the stream vanished)
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (the stored version is not an integer)
--! include keys

local wrong_keys = check_keys({false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 3 then
  return redis.error_reply('ROUTER_INVALID route_changes takes generation, version, count')
end
if not string.match(ARGV[2], '^[0-9]+$') or #ARGV[2] > 15 then
  return redis.error_reply('ROUTER_INVALID the version must be an integer >= 0')
end
if not string.match(ARGV[3], '^[1-9][0-9]*$') or #ARGV[3] > 9 then
  return redis.error_reply('ROUTER_INVALID the count must be a positive integer')
end
local after = tonumber(ARGV[2])
local meta = redis.call('HMGET', KEYS[2], 'generation', 'version')
if not meta[1] then
  if ARGV[1] == '' and after == 0 then
    return {'ok', 0}
  end
  return {'resync', 'gone'}
end
if meta[1] ~= ARGV[1] then
  return {'resync', 'generation'}
end
if not meta[2] or not string.match(meta[2], '^[0-9]+$') or #meta[2] > 15 then
  return redis.error_reply('ROUTER_CORRUPT the stored route version is not an integer')
end
local version = tonumber(meta[2])
if after > version then
  return {'resync', 'ahead'}
end
if after == version then
  return {'ok', version}
end
local start = string.format('%.0f-0', after + 1)
local entries = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', ARGV[3])
if #entries == 0 or entries[1][1] ~= start then
  return {'resync', 'trimmed'}
end
local result = {'ok', version}
for i = 1, #entries do
  local id, fields = entries[i][1], entries[i][2]
  local route, count = nil, nil
  for j = 1, #fields, 2 do
    if fields[j] == 'r' then
      route = fields[j + 1]
    elseif fields[j] == 'n' then
      count = fields[j + 1]
    end
  end
  if not route or not count then
    return redis.error_reply('ROUTER_CORRUPT a route stream entry lacks its fields')
  end
  result[#result + 1] = tonumber(string.match(id, '^([0-9]+)-'))
  result[#result + 1] = route
  result[#result + 1] = count
end
return result
