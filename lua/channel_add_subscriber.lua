-- Create a channel subscriber whose cursor is the current channel clock (it never sees
-- earlier messages). Creating the channel clock when it is missing sets it to 0.
-- KEYS[1] = the channel clock (string: an integer in +-(2^53-1))
-- KEYS[2] = the subscriber's cursor (string: the last clock it acknowledged)
-- KEYS[3] = the channel's epoch (string: a token that is new whenever the channel is made
--           anew, as after a FLUSHALL or a restart that lost it)
-- ARGV[1] = TTL in seconds (a positive integer) for a new cursor, the clock and the epoch
-- ARGV[2] = '' for a new subscriber; for a subscriber whose cursor was lost, the epoch it
--           last saw: when the channel's epoch is another one (or missing), the channel was
--           made anew since, so the cursor starts at 0, before every message of the new
--           channel, instead of at its clock (which would skip what was stored meanwhile)
-- returns {created, epoch}: created = 1 when the subscriber was created, 0 when it existed
--         already (then nothing changes but a missing epoch, which is made); epoch = the
--         channel's epoch after the call. A cursor left without its clock (the clock
--         expired) is a lost subscriber: it is created again at the new clock, 0.
-- errors: ROUTER_INVALID (malformed ARGV, keys of two hash tags), ROUTER_CORRUPT (the clock,
--         cursor or epoch is not a string, or the clock or cursor is not an integer clock);
--         nothing is changed then
--! include clocks

if #KEYS ~= 3 or #ARGV ~= 2 then
  return redis.error_reply('ROUTER_INVALID channel_add_subscriber takes 3 keys, TTL, epoch')
end
local tag = tag_of(KEYS[1])
if not tag or tag_of(KEYS[2]) ~= tag or tag_of(KEYS[3]) ~= tag then
  return redis.error_reply('ROUTER_INVALID the keys must belong to one channel')
end
local ttl = ARGV[1]
if not string.match(ttl, '^[1-9]%d*$') or #ttl > 12 then
  return redis.error_reply('ROUTER_INVALID the TTL must be a positive integer of seconds')
end

local clock, bad_clock = read(KEYS[1])
local cursor, bad_cursor = read(KEYS[2])
local epoch, bad_epoch = read(KEYS[3])
if bad_clock or bad_cursor or bad_epoch then
  return redis.error_reply('ROUTER_CORRUPT the channel clock, cursor or epoch is not a string')
end
if clock and not to_clock(clock) then
  return redis.error_reply('ROUTER_CORRUPT the channel clock is not an integer clock')
end
if cursor and not to_clock(cursor) then
  return redis.error_reply('ROUTER_CORRUPT the subscriber cursor is not an integer clock')
end
local restarted = ARGV[2] ~= '' and epoch ~= ARGV[2]
if not epoch then
  local time = redis.call('TIME')
  epoch = time[1] .. '.' .. time[2]
  redis.call('SET', KEYS[3], epoch, 'EX', ttl)
end
if clock and cursor then
  return {0, epoch}
end
if clock then
  redis.call('EXPIRE', KEYS[1], ttl)
else
  clock = '0'
  redis.call('SET', KEYS[1], clock, 'EX', ttl)
end
if restarted then
  redis.call('SET', KEYS[2], '0', 'EX', ttl)
else
  redis.call('SET', KEYS[2], clock, 'EX', ttl)
end
return {1, epoch}
