"""The heap settling of a node process (router.ops.node_process)."""

from __future__ import annotations

import gc

from router.ops.node_process import freeze_startup_heap


def test_objects_alive_at_the_freeze_leave_the_collectors_scans() -> None:
    kept = [object()]
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        assert not any(obj is kept for obj in gc.get_objects())
        later = [object()]
        assert any(obj is later for obj in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(obj is kept for obj in gc.get_objects())
