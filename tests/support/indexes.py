"""Every filter index the trie can run on, for tests that must hold on each.

The compiled index is imported directly: a checkout where it was not built fails these
tests instead of skipping them (``make test`` builds it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from router.core._filter_index import FilterIndex as CompiledFilterIndex
from router.core.filter_index import PureFilterIndex

#: name -> a factory of an empty index: the C index, the pure one with its shape index,
#: and the pure one always walking its trie.
INDEXES: dict[str, Callable[[], Any]] = {
    "compiled": CompiledFilterIndex,
    "pure-shapes": PureFilterIndex,
    "pure-walk": lambda: PureFilterIndex(max_shapes=0),
}
