"""A chat room over WebSocket, one Django project served by several workers.

Each worker (Daphne or Uvicorn, any number of them, on any machines) runs the same ASGI
application; their Channels layer is a router cluster on one Redis (standalone or
Cluster), so a line typed into a room on one worker reaches the room's members on every
worker. See docs/integrations.md (Django Channels) and settings.py.
"""
