"""The pure core: topic rules, the subscription trie, sharing strategies, aliases, the
route mirror, the hot-topic cache, hooks, the ACL and message value types.

Imports the standard library and :mod:`router.errors` only: no Redis, no msgpack, no
asyncio I/O (``tests/system/test_layering.py`` reads every import and keeps it so).
"""
