-- Write back a node's claim on a client's session after Redis lost it (FLUSHALL, a restart
-- without persistence), unless some node owns the session now.
-- KEYS[1] = the client's owner hash (fields node, epoch)
-- ARGV[1] = the id of the node that serves the session
-- ARGV[2] = the epoch of its claim (decimal)
-- returns 1 when the claim was written back, 0 when the session has an owner (unchanged)
-- errors: ROUTER_INVALID (malformed ARGV or KEYS); nothing is changed then
--! include keys

local wrong_keys = check_keys({'hash'})
if wrong_keys then
  return redis.error_reply(wrong_keys)
end

if #ARGV ~= 2 or ARGV[1] == '' then
  return redis.error_reply('ROUTER_INVALID client_restore takes a node id and an epoch')
end
if not string.match(ARGV[2], '^[1-9][0-9]*$') or #ARGV[2] > 16 then
  return redis.error_reply('ROUTER_INVALID the owner epoch must be a positive integer')
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'node', ARGV[1], 'epoch', ARGV[2])
return 1
