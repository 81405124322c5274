-- Acknowledge a subscriber's messages up to a clock: move its cursor there.
-- KEYS[1] = the channel clock (string: an integer in +-(2^53-1))
-- KEYS[2] = the subscriber's cursor (string: the last clock it acknowledged)
-- ARGV[1] = the acknowledged clock (from an ack handle, already checked by the caller)
-- ARGV[2] = TTL in seconds (a positive integer) for the clock and the cursor
-- An ack is valid when cursor < ack <= clock or, after a wrap (clock < cursor), when
-- cursor < ack or ack <= clock.
-- returns 1 when valid: the cursor is set to the ack and both TTLs are extended;
--         0 when stale: nothing changes, no value and no TTL
-- errors: ROUTER_INVALID (malformed ARGV, keys of two hash tags), ROUTER_BAD_HANDLE (the ack
--         is not an integer clock), ROUTER_NO_SUBSCRIPTION (cursor or clock missing),
--         ROUTER_CORRUPT (clock or cursor not an integer clock); nothing is changed then
--! include clocks

if #KEYS ~= 2 or #ARGV ~= 2 then
  return redis.error_reply('ROUTER_INVALID channel_ack takes 2 keys, an ack clock and a TTL')
end
if not tag_of(KEYS[1]) or tag_of(KEYS[2]) ~= tag_of(KEYS[1]) then
  return redis.error_reply('ROUTER_INVALID the keys must belong to one channel')
end
local ttl = ARGV[2]
if not string.match(ttl, '^[1-9]%d*$') or #ttl > 12 then
  return redis.error_reply('ROUTER_INVALID the TTL must be a positive integer of seconds')
end
local ack = to_clock(ARGV[1])
if not ack then
  return redis.error_reply('ROUTER_BAD_HANDLE the acknowledged clock is not an integer clock')
end

local clock, cursor = read_position(KEYS[1], KEYS[2])
if not clock then
  return redis.error_reply(cursor)
end

local valid
if cursor <= clock then
  valid = cursor < ack and ack <= clock
else
  valid = cursor < ack or ack <= clock
end
if not valid then
  return 0
end
redis.call('SET', KEYS[2], string.format('%.0f', ack), 'EX', ttl)
redis.call('EXPIRE', KEYS[1], ttl)
return 1
