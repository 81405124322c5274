-- Adopt the session of a dead node's client: claim it, mark it away, return its description
-- and its filters.
-- KEYS[1] = the client's subscriptions hash, KEYS[2] its owner hash (fields node, epoch),
-- KEYS[3..7] = its alias hashes, KEYS[8] = its session hash (SubscriptionStore.client_keys)
-- ARGV[1] = the dead node's id, ARGV[2] = the epoch of its claim (what the caller read)
-- ARGV[3] = the id of the node that adopts the session
-- ARGV[4] = the Session Expiry Interval (seconds) from which a session never expires
-- returns false when the owner hash no longer holds exactly (ARGV[1], ARGV[2]) (the client
--         resumed its session somewhere, or it ended), or when the session hash describes
--         no persistent session (missing, or its expiry is 0): nothing is changed then;
--         else {new epoch as a decimal string, {the session hash as marked away: field,
--         value, ...}, {filter, packed options, filter, packed options, ...}}; every key
--         of the client then expires the session's expiry from now (never from ARGV[4])
-- errors: ROUTER_INVALID (malformed ARGV or KEYS), ROUTER_CORRUPT (stored epoch or expiry
--         not an integer); nothing is changed then
--
-- One step, so that a client that connects anywhere meanwhile either finds the session
-- adopted (a newer epoch, which it claims in turn) or keeps it (the adoption skips it).
-- The adopter needs no description read beforehand: the expiry comes from the session
-- hash, and the description goes back with the claim.
-- The new epoch is that of client_claim: max(old epoch + 1, server time in microseconds).
--! include keys

-- (the keys' types are not asked for: every key the script reads or writes by type is
-- read before the first write, so a key of another type fails the script, WRONGTYPE,
-- before anything changed; TYPE calls cost a third of the script's time)
local wrong_keys = check_keys({false, false, false, false, false, false, false, false})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 4 or ARGV[1] == '' or ARGV[3] == '' then
  return redis.error_reply('ROUTER_INVALID session_adopt takes dead node, epoch, node, expiry')
end
if not string.match(ARGV[2], '^[1-9][0-9]*$') then
  return redis.error_reply('ROUTER_INVALID the owner epoch must be a positive integer')
end
if not string.match(ARGV[4], '^[1-9][0-9]*$') or #ARGV[4] > 12 then
  return redis.error_reply('ROUTER_INVALID session_adopt takes a positive never-expiry')
end
local current = redis.call('HMGET', KEYS[2], 'node', 'epoch')
if current[1] ~= ARGV[1] or current[2] ~= ARGV[2] then
  return false
end
local old = tonumber(current[2])
if old >= 9007199254740991 then
  return redis.error_reply('ROUTER_CORRUPT the stored owner epoch is not an integer')
end
local stored = redis.call('HGET', KEYS[8], 'expiry')
if not stored or stored == '0' then
  return false
end
if not string.match(stored, '^[1-9][0-9]*$') or #stored > 12 then
  return redis.error_reply('ROUTER_CORRUPT the stored session expiry is not an integer')
end
local filters = redis.call('HGETALL', KEYS[1])
local time = redis.call('TIME')
local epoch = tonumber(time[1]) * 1000000 + tonumber(time[2])
if old >= epoch then
  epoch = old + 1
end
local text = string.format('%.0f', epoch)
redis.call('HSET', KEYS[2], 'node', ARGV[3], 'epoch', text)
local now = string.format('%.0f', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
redis.call('HSET', KEYS[8], 'node', ARGV[3], 'connected', '0', 'since', now)
local expiry = -1
if tonumber(stored) < tonumber(ARGV[4]) then
  expiry = tonumber(stored) * 1000
end
for i = 1, #KEYS do
  if expiry < 0 then
    redis.call('PERSIST', KEYS[i])
  else
    redis.call('PEXPIRE', KEYS[i], string.format('%.0f', expiry))
  end
end
return {text, redis.call('HGETALL', KEYS[8]), filters}
