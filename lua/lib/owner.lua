-- Shared by the client scripts (included with `--! include owner`, see router/state/scripts.py).
-- check_owner(owner_key, node, epoch): nil when the caller may write for the client (node ''
-- and epoch '': no check asked; else the owner hash holds exactly that node and epoch), or
-- the coded error message to reply with (ROUTER_INVALID, ROUTER_NOT_OWNER, ROUTER_CORRUPT).
local function check_owner(owner_key, node, epoch)
  if node == '' then
    if epoch ~= '' then
      return 'ROUTER_INVALID an epoch needs a node id'
    end
    return nil
  end
  if not string.match(epoch, '^[1-9][0-9]*$') then
    return 'ROUTER_INVALID the owner epoch must be a positive integer'
  end
  local current = redis.call('HMGET', owner_key, 'node', 'epoch')
  if not current[1] then
    return 'ROUTER_NOT_OWNER no node owns the session'
  end
  if not current[2] or not string.match(current[2], '^[1-9][0-9]*$') then
    return 'ROUTER_CORRUPT the stored owner epoch is not an integer'
  end
  if current[1] ~= node or current[2] ~= epoch then
    return 'ROUTER_NOT_OWNER the session is owned by another node or epoch'
  end
  return nil
end
