"""Settings of the chat example: no database, one app, the router as the Channels layer.

The environment says where Redis is (``ROUTER_REDIS_URL``, default the local one) and
which router namespace the workers share (``CHAT_PREFIX``, default ``chat``).
"""

import os

SECRET_KEY = os.environ.get("CHAT_SECRET_KEY", "an example, not a secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["channels"]
ROOT_URLCONF = "chat.urls"
ASGI_APPLICATION = "chat.asgi.application"
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "router.integrations.channels_layer.RouterChannelLayer",
        "CONFIG": {
            "url": os.environ.get("ROUTER_REDIS_URL", "redis://127.0.0.1:6379/0"),
            "prefix": os.environ.get("CHAT_PREFIX", "chat"),
            "capacity": 100,  # messages one consumer may have waiting
            "expiry": 60,  # seconds a message waits for its consumer
        },
    }
}
