"""Shared state in Redis: key names, Lua scripts, connections, subscriptions and session
owners, topic aliases, route sets with their change streams, the node registry, channel
clocks and the retained store.

Imports :mod:`router.core`, redis and msgpack. Every key name is built in
:mod:`router.state.keys`; every script touches the keys of one hash tag.
"""
