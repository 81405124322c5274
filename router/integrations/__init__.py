"""Pub/sub backends for Python frameworks, each on a node embedded in the process.

One module per framework, each importing its framework (an optional extra), so nothing
here is loaded unless asked for by name:

* :mod:`router.integrations.channels_layer`: a Django Channels layer (``router[channels]``);
* :mod:`router.integrations.socketio_manager`: a python-socketio client manager
  (``router[socketio]``; its topics and subscriptions: :mod:`router.integrations.socketio_rooms`);
* :mod:`router.integrations.broadcast_backend`: a broadcaster backend (``router[broadcaster]``).

Each routes a message only to the processes with an interested receiver (the node's route
mirror), runs on standalone Redis and Redis Cluster alike, and counts what it drops.
"""
