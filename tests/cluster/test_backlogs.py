"""A dead node's inbox read once for every client that resumes from it: the messages a
client's filters match, in stored order, and only what was added since on a later read.
On fakeredis and a real Redis."""

from __future__ import annotations

import uuid

import pytest

from router.cluster.inbox import Forward, pack_batch
from router.cluster.sessions.backlogs import Backlog, Backlogs
from router.core.messages import Message
from router.core.topics import TopicName
from router.state.channels import Channel, ChannelMessage
from router.state.keys import Keys
from router.state.scripts import RedisClient

BACKENDS = pytest.mark.parametrize("redis_backend", ["fake", "standalone"], indirect=True)


def record(*topics: str) -> bytes:
    return pack_batch(
        [Forward(Message(uuid.uuid4().bytes, TopicName(t), t.encode())) for t in topics]
    )


@BACKENDS
async def test_a_backlog_reads_the_inbox_once_and_matches_by_topic(
    redis_client: RedisClient, keys: Keys
) -> None:
    inbox = Channel(redis_client, keys.inbox("dead"), 300.0, keys)
    await inbox.add_subscriber("dead")
    await inbox.publish([ChannelMessage("r1", record("fleet/1", "fleet/2", "other/x"))])
    await inbox.publish([ChannelMessage("r2", record("fleet/1"))])
    backlog = Backlog()
    await backlog.catch_up(inbox, "dead")
    assert [m.payload for m in backlog.matching(["fleet/1"])] == [b"fleet/1", b"fleet/1"]
    assert [m.payload for m in backlog.matching(["fleet/+"])] == [
        b"fleet/1",
        b"fleet/2",
        b"fleet/1",
    ]
    assert backlog.matching(["nothing/#"]) == []
    await inbox.publish([ChannelMessage("r3", record("other/x"))])
    await backlog.catch_up(inbox, "dead")  # (only what came since)
    assert len(backlog.messages) == 5
    assert [m.payload for m in backlog.matching(["#"])][-1] == b"other/x"
    await inbox.aclose()


def test_backlogs_are_dropped_when_forgotten_or_unused() -> None:
    clock = [0.0]
    backlogs = Backlogs(10.0, lambda: clock[0])
    first = backlogs.of("a")
    assert backlogs.of("a") is first
    backlogs.forget("a")
    assert backlogs.of("a") is not first
    second = backlogs.of("a")
    clock[0] = 11.0
    backlogs.of("b")  # (a was unused for longer than 10 s)
    assert backlogs.of("a") is not second
