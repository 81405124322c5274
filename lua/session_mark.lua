-- Mark a client's session connected or away, if the caller owns it.
-- KEYS[1] = the client's subscriptions hash, KEYS[2] its owner hash (fields node, epoch),
-- KEYS[3..7] = its alias hashes, KEYS[8] = its session hash (SubscriptionStore.client_keys)
-- ARGV[1] = the owner node id the caller acts for (never '': nodes always fence this)
-- ARGV[2] = the owner epoch the caller holds (decimal)
-- ARGV[3] = 'open' (the client is connected: every key persists) or 'away' (the client left:
--           every key expires after ARGV[4] milliseconds, or never when ARGV[4] is '-1')
-- ARGV[4] = the session expiry in milliseconds ('-1': never; ignored by 'open')
-- ARGV[5], ARGV[6], ... = field/value pairs written into the session hash
-- returns the server time in milliseconds, written as the hash's since field
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_NOT_OWNER (another owner or epoch),
--         ROUTER_CORRUPT (the stored epoch is not an integer); nothing is changed then
--! include owner
--! include keys

local wrong_keys = check_keys({false, false, false, false, false, false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

local n = #ARGV
if n < 4 or n % 2 ~= 0 or ARGV[1] == '' then
  return redis.error_reply('ROUTER_INVALID session_mark takes node, epoch, mode, expiry, pairs')
end
local mode = ARGV[3]
if mode ~= 'open' and mode ~= 'away' then
  return redis.error_reply('ROUTER_INVALID session_mark mode is open or away')
end
if ARGV[4] ~= '-1' and (not string.match(ARGV[4], '^[0-9]+$') or #ARGV[4] > 15) then
  return redis.error_reply('ROUTER_INVALID session_mark expiry is -1 or milliseconds >= 0')
end
local expiry = tonumber(ARGV[4])
local refused = check_owner(KEYS[2], ARGV[1], ARGV[2])
if refused then
  return redis.error_reply(refused)
end
local time = redis.call('TIME')
local now = string.format('%.0f', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
for i = 5, n, 2 do
  redis.call('HSET', KEYS[8], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[8], 'node', ARGV[1], 'connected', mode == 'open' and '1' or '0', 'since', now)
for i = 1, #KEYS do
  if mode == 'open' or expiry < 0 then
    redis.call('PERSIST', KEYS[i])
  else
    redis.call('PEXPIRE', KEYS[i], string.format('%.0f', math.max(expiry, 1)))
  end
end
return now
