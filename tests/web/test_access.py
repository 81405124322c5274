"""What a login is counted under (no node needed): an address, an IPv6 /64."""

from __future__ import annotations

import pytest

from router.web.access import source_of


@pytest.mark.parametrize(
    ("remote", "source"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::ffff:10.0.0.7", "10.0.0.7"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
        ("::1", "::/64"),
        ("", "?"),
        (None, "?"),
    ],
)
def test_source_of(remote: str | None, source: str) -> None:
    assert source_of(remote) == source
