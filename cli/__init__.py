"""The ``router`` command line (click). Thin: parse options, call the library, print."""

from . import (
    bench,
    dashboard_accounts,
    demo,
    events,
    pipeline,
    pubsub,
    reconcile,
    redis_acl,
    retained_messages,
    run,
    tracing,
    users_and_rules,
    views,
)
from .application import app, main

app.add_command(bench.bench)
app.add_command(dashboard_accounts.dashboard)
app.add_command(demo.demo)
app.add_command(events.events)
app.add_command(tracing.trace)
app.add_command(retained_messages.retained)
app.add_command(pipeline.pipeline)
app.add_command(redis_acl.redis_acl)
app.add_command(users_and_rules.users)
app.add_command(users_and_rules.acl)
for _command in (*views.COMMANDS, *pubsub.COMMANDS, run.node, reconcile.reconcile):
    app.add_command(_command)

__all__ = ["app", "main"]
