"""Lua scripts of the router, one file per script (loaded by router.state.scripts)."""
