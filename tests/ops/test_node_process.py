"""The collector settings of a node process (router.ops.node_process)."""

from __future__ import annotations

import gc

from router.ops.node_process import YOUNG_THRESHOLD, settle_collector


def test_objects_alive_when_settled_leave_the_collectors_scans() -> None:
    kept = [object()]
    threshold = gc.get_threshold()
    try:
        settle_collector()
        assert gc.get_freeze_count() > 0
        assert not any(obj is kept for obj in gc.get_objects())
        later = [object()]
        assert any(obj is later for obj in gc.get_objects())
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert any(obj is kept for obj in gc.get_objects())


def test_the_young_generation_is_collected_rarely_and_the_older_ones_as_before() -> None:
    threshold = gc.get_threshold()
    try:
        settle_collector()
        assert gc.get_threshold() == (YOUNG_THRESHOLD, threshold[1], threshold[2])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
