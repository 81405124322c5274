-- Store the retained message of one topic in its shard (create it, or replace it).
-- KEYS[1] = the shard's topics sorted set (every score 0: ordered by topic bytes)
-- KEYS[2] = the shard's messages hash (topic -> packed message)
-- KEYS[3] = the shard's expiry sorted set (topic -> expiry time, server ms)
-- ARGV[1] = the topic (its first level names the shard)
-- ARGV[2] = the packed message (non-empty)
-- ARGV[3] = the message expiry interval in ms, '0' for a message that never expires
-- ARGV[4] = '1' to create the topic when absent, '0' to replace an existing one only
-- ARGV[5] (optional) = the bytes the store may still grow by ('' or absent: no bound); a
--           message that would grow the shard's stored bytes by more is not stored
-- returns {status, growth}: status 1 if the topic was created, 0 if its message was
--         replaced, -1 if it was absent and ARGV[4] was '0', -2 if it would grow the
--         store past ARGV[5] (nothing stored for -1 and -2); growth the bytes the stored
--         message grew by (the new packed message's length less the old one's, 0 if
--         nothing was stored)
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key holds
--         another type); nothing is changed then
--! include keys

local wrong_keys = check_keys({'zset', 'hash', 'zset'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if (#ARGV ~= 4 and #ARGV ~= 5) or ARGV[1] == '' or ARGV[2] == '' then
  return redis.error_reply(
    'ROUTER_INVALID retained_store takes topic, message, expiry ms, create and optionally room')
end
local room = nil
if #ARGV == 5 and ARGV[5] ~= '' then
  if not string.match(ARGV[5], '^%-?[0-9]+$') or #ARGV[5] > 16 then
    return redis.error_reply('ROUTER_INVALID the room must be a number of bytes')
  end
  room = tonumber(ARGV[5])
end
if not string.match(ARGV[3], '^[0-9]+$') or #ARGV[3] > 15 then
  return redis.error_reply('ROUTER_INVALID the expiry must be a number of milliseconds')
end
if ARGV[4] ~= '0' and ARGV[4] ~= '1' then
  return redis.error_reply('ROUTER_INVALID create must be 0 or 1')
end
local exists = redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1
if not exists and ARGV[4] == '0' then
  return {-1, 0}
end
local growth = #ARGV[2] - redis.call('HSTRLEN', KEYS[2], ARGV[1])
if room ~= nil and growth > 0 and growth > room then
  return {-2, 0}
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[1], 0, ARGV[1])
local expiry = tonumber(ARGV[3])
if expiry > 0 then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('ZADD', KEYS[3], string.format('%.0f', now + expiry), ARGV[1])
else
  redis.call('ZREM', KEYS[3], ARGV[1])
end
if exists then
  return {0, growth}
end
return {1, growth}
