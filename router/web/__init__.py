"""The HTTP listener of a node: ``/metrics``, ``/healthz``, the JSON API under ``/api/v1``
and the dashboard (``router node run --http HOST:PORT``)."""
