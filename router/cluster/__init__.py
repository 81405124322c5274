"""The asyncio runtime of one node: :class:`~router.cluster.node.RouterNode` wires local
sessions, the session lifecycle (:mod:`router.cluster.sessions`), the route writer,
mirror sync, inbox forwarding, hooks and the ACL (policy), retained delivery and the
traffic log.

Imports :mod:`router.core` and :mod:`router.state`.
"""
