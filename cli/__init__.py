"""The ``router`` command line (click). Thin: parse options, call the library, print."""

from . import bench, demo
from .app import app, main

app.add_command(bench.bench)
app.add_command(demo.demo)

__all__ = ["app", "main"]
