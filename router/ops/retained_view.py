"""A retained message as plain data, the same for ``router retained`` and the HTTP API.

``{"topic", "payload", "encoding", "bytes", "qos", "expiry_interval", "message_id",
"publisher"}``: ``payload`` is the text when the payload is UTF-8 (``"encoding":
"utf-8"``), else its base64 (``"encoding": "base64"``); ``bytes`` the payload's size;
``expiry_interval`` the seconds left (null: never expires); ``message_id`` hex.
"""

from __future__ import annotations

import base64
from typing import Any

from router.state.retained_store import RetainedMessage


def retained_record(message: RetainedMessage) -> dict[str, Any]:
    """``message`` as plain data (see the module docstring)."""
    try:
        payload, encoding = message.payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        payload, encoding = base64.b64encode(message.payload).decode("ascii"), "base64"
    return {
        "topic": message.topic,
        "payload": payload,
        "encoding": encoding,
        "bytes": len(message.payload),
        "qos": message.qos,
        "expiry_interval": message.expiry_interval,
        "message_id": message.message_id.hex(),
        "publisher": message.publisher,
    }
