"""The ASGI application: the page over HTTP, the rooms over WebSocket.

Serve it with any ASGI server, as many workers as you like::

    cd examples/django_chat
    daphne -b 127.0.0.1 -p 8001 chat.asgi:application
    uvicorn --port 8002 chat.asgi:application
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chat.settings")
http = get_asgi_application()  # (sets Django up before the consumers are imported)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402

from chat.consumers import ChatConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": http,
        "websocket": URLRouter([path("ws/chat/<slug:room>/", ChatConsumer.as_asgi())]),
    }
)
