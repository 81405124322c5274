"""One WebSocket connection: a member of its room's group while it is open."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer


class ChatConsumer(AsyncWebsocketConsumer):  # type: ignore[misc]
    """``/ws/chat/<room>/``: every text frame goes to everyone in the room, on any worker."""

    async def connect(self) -> None:
        self.room = f"chat.{self.scope['url_route']['kwargs']['room']}"
        await self.channel_layer.group_add(self.room, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(self.room, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data:
            await self.channel_layer.group_send(
                self.room, {"type": "chat.message", "text": text_data}
            )

    async def chat_message(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["text"])
