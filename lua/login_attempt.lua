-- Take a slot for one dashboard login in two sliding windows, its user's and its source
-- address's, before its password is checked (router/state/login_attempts.py): a slot in
-- both, or in neither. Attempts older than the window are forgotten either way.
-- KEYS[1] = the user's attempts (sorted set: attempt id -> server ms it was taken)
-- KEYS[2] = the address's attempts (sorted set, likewise)
-- ARGV[1] = the attempt id (unique; the caller ZREMs it again when the login succeeds)
-- ARGV[2] = the slots of a window (an integer from 1 to 999999)
-- ARGV[3] = the window in milliseconds (an integer from 1 to 999999999999)
-- returns {0, 0} when the slot is taken (the id added to both sets, each expiring a window
--   after its newest attempt); else {1 (the user's window is full) or 2 (the address's),
--   the ms until that window frees a slot (>= 1)}, and nothing added
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (a key of another type)
--! include keys

local wrong_keys = check_keys({'zset', 'zset'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end
if #ARGV ~= 3 or ARGV[1] == '' then
  return redis.error_reply('ROUTER_INVALID login_attempt takes attempt id, slots, window ms')
end
if not string.match(ARGV[2], '^[1-9][0-9]*$') or #ARGV[2] > 6 then
  return redis.error_reply('ROUTER_INVALID the slots must be an integer from 1 to 999999')
end
if not string.match(ARGV[3], '^[1-9][0-9]*$') or #ARGV[3] > 12 then
  return redis.error_reply('ROUTER_INVALID the window must be a positive number of milliseconds')
end
local slots, window = tonumber(ARGV[2]), tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local horizon = string.format('%.0f', now - window)

for i = 1, 2 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', horizon)
end
for i = 1, 2 do
  local held = redis.call('ZCARD', KEYS[i])
  if held >= slots then
    -- (a slot frees when the attempt held - slots places after the oldest leaves)
    local freeing = redis.call('ZRANGE', KEYS[i], held - slots, held - slots, 'WITHSCORES')
    return {i, math.max(1, tonumber(freeing[2]) + window - now)}
  end
end
local at = string.format('%.0f', now)
for i = 1, 2 do
  redis.call('ZADD', KEYS[i], at, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], window)
end
return {0, 0}
