"""The session lifecycle of a node, in one room.

:class:`~router.cluster.sessions.lifecycle.SessionLifecycle` moves every local session
through its states (:mod:`~router.cluster.sessions.states`: attaching, connected, away,
leaving, closed) and keeps Redis in step with it: the claim on each session and its
takeover (:mod:`~router.cluster.sessions.claims`), the queue of an away session and the
handoff of a moving one (:mod:`~router.cluster.sessions.keeper`,
:mod:`~router.cluster.sessions.resumes`), the copies a dead node left in its inbox
(:mod:`~router.cluster.sessions.recovery`), the adoption of a dead node's persistent
sessions (:mod:`~router.cluster.sessions.adoption`), the write-back after Redis lost them
(:mod:`~router.cluster.sessions.restoration`), one step per client at a time
(:mod:`~router.cluster.sessions.client_locks`). The node's sessions themselves, with their
delivery queues, are :mod:`~router.cluster.sessions.local_sessions`; when a moved session
has every late copy, :mod:`~router.cluster.sessions.move_fence`.

The node reaches it through ``SessionLifecycle``'s methods; nothing here imports the
node.
"""
