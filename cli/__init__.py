"""The ``router`` command line (click). Thin: parse options, call the library, print."""

from . import bench, clients, demo, inspect, pipeline, reconcile, retained, run
from .app import app, main

app.add_command(bench.bench)
app.add_command(demo.demo)
app.add_command(retained.retained)
app.add_command(pipeline.pipeline)
for _command in (*inspect.COMMANDS, *clients.COMMANDS, run.node, reconcile.reconcile):
    app.add_command(_command)

__all__ = ["app", "main"]
