"""``router events``: what happened in the cluster, newest first (see
:mod:`router.state.event_log`): nodes up, down, stopped and purged, Redis unreachable or
slow, queues overflowing, takeover storms, bans.

One line an event, for people and ``grep``::

    2026-12-03 07:10:01 UTC  critical  node_down     node-2  node node-2 is down since ...

JSON shape (``--json``): ``[{"id", "at_ms", "kind", "severity", "node", "subject",
"text"}]`` (``at_ms``: Redis server time, Unix milliseconds; ``node``: who told it).
"""

from __future__ import annotations

import time

import click

from router.state.event_log import KINDS, Event, EventLog

from .common import Target, echo_json, json_option, redis_client, run, target_options as target

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h`` or ``1d`` as seconds (click's BadParameter else)."""
    unit = text[-1:] if text[-1:] in _UNITS else "s"
    number = text[:-1] if text[-1:] in _UNITS else text
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a duration such as 90s, 15m, 2h") from None
    if not value > 0:
        raise click.BadParameter("a duration is more than 0")
    return value


def event_line(event: Event) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(event.at_ms / 1000))
    return f"{when}  {event.severity:<8}  {event.kind:<17}  {event.subject}  {event.text}"


@click.command()
@target
@click.option("--since", default=None, help="Only events of the last DURATION (90s, 15m, 2h).")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(sorted(KINDS)),
    help="Only events of this kind (repeat for more).",
)
@click.option("--subject", default=None, help="Only events about this node, client or ban.")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=50, show_default=True)
@json_option
def events(
    target: Target,
    since: str | None,
    kinds: tuple[str, ...],
    subject: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """What happened in the cluster, newest first (kept for a day)."""
    since_ms = 0 if since is None else int((time.time() - _seconds(since)) * 1000)

    async def main() -> list[Event]:
        async with redis_client(target) as redis:
            return await EventLog(redis, target.keys).recent(
                limit, since_ms=since_ms, kinds=kinds or None, subject=subject
            )

    found = run(main())
    if as_json:
        echo_json([event.as_dict() for event in found])
    elif not found:
        click.echo("no events")
    for event in [] if as_json else found:
        click.echo(event_line(event))
