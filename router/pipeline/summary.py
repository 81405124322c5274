"""The report for people: ``summary.md`` with tables, and two PNG plots.

``fanout.png``: publishes by the number of subscribers they reached (fan-out values past
:data:`MAX_BARS` distinct ones are grouped in powers of two). ``per_node.png``: copies
each node sent to and received from other nodes, beside its publishes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Final

from router.pipeline.model import Report

MAX_BARS: Final = 40
SUMMARY: Final = "summary.md"
FANOUT_PLOT: Final = "fanout.png"
PER_NODE_PLOT: Final = "per_node.png"


def fanout_bars(fanout: dict[int, int]) -> list[tuple[str, int]]:
    """Bars of the fan-out histogram: one per value, or per power-of-two bucket when
    there are more than :data:`MAX_BARS` values (``0``, ``1``, ``2-3``, ``4-7``, ...)."""
    if len(fanout) <= MAX_BARS:
        return [(str(value), count) for value, count in sorted(fanout.items())]
    buckets: dict[int, int] = {}
    for value, count in fanout.items():
        low = 0 if value == 0 else 1 << (value.bit_length() - 1)
        buckets[low] = buckets.get(low, 0) + count
    return [
        (str(low) if low < 2 else f"{low}-{2 * low - 1}", count)
        for low, count in sorted(buckets.items())
    ]


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    def cell(value: object) -> str:
        text = f"{value:,}" if isinstance(value, int) else str(value)
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return [*lines, ""]


def summary_markdown(report: Report) -> str:
    """The Markdown text of ``summary.md``."""
    savings = report.savings
    lines = [
        "# Routing report",
        "",
        f"{report.messages:,} publishes ({report.bytes:,} payload bytes) to "
        f"{report.topics:,} topics, matched against {report.subscriptions:,} subscriptions"
        + (
            f" ({report.ignored_subscriptions:,} invalid ones ignored)."
            if report.ignored_subscriptions
            else "."
        ),
        "",
        "## Interest-based routing against broadcast",
        "",
        *_table(
            ["", "copies", "bytes"],
            [
                ("interest-based (the log)", savings.interest_copies, savings.interest_bytes),
                (
                    f"broadcast to all {savings.nodes} nodes",
                    savings.broadcast_copies,
                    savings.broadcast_bytes,
                ),
                ("saved", savings.saved_copies, savings.saved_bytes),
            ],
        ),
        f"Interest-based routing sent {1 - savings.saved_fraction:.1%} of the copies a "
        f"broadcast would have sent ({savings.saved_fraction:.1%} saved).",
        "",
        "## Per node",
        "",
        f"![copies per node]({PER_NODE_PLOT})",
        "",
        *_table(
            [
                "node",
                "published",
                "bytes",
                "sent copies",
                "sent bytes",
                "received copies",
                "received bytes",
                "local deliveries",
            ],
            [
                (
                    n.node,
                    n.published,
                    n.published_bytes,
                    n.sent_copies,
                    n.sent_bytes,
                    n.received_copies,
                    n.received_bytes,
                    n.local_deliveries,
                )
                for n in report.per_node
            ],
        ),
        "## Fan-out",
        "",
        f"![fan-out]({FANOUT_PLOT})",
        "",
        *_table(["subscribers", "publishes"], fanout_bars(report.fanout)),
        *_table(["nodes forwarded to", "publishes"], sorted(report.node_fanout.items())),
        "## Hot topics",
        "",
        *_table(
            ["topic", "publishes", "bytes", "subscribers"],
            [(t.topic, t.messages, t.bytes, t.subscribers) for t in report.hot_topics],
        ),
        "## Filters that cost the most to match",
        "",
        "Deliveries: the copies a filter produced (its subscribers for every publish it "
        "matched; one for a share group).",
        "",
        *_table(
            ["filter", "subscribers", "publishes matched", "deliveries", "delivered bytes"],
            [
                (c.filter, c.subscribers, c.messages, c.deliveries, c.delivered_bytes)
                for c in report.filter_cost
            ],
        ),
        "## Publishes that reached no subscriber",
        "",
        f"{report.no_subscriber_messages:,} publishes matched no subscription of the "
        f"snapshot; the log itself shows {report.unrouted_messages:,} publishes neither "
        "forwarded nor delivered locally.",
        "",
        *_table(
            ["topic", "publishes", "bytes"],
            [(t.topic, t.messages, t.bytes) for t in report.no_subscriber_topics],
        ),
    ]
    return "\n".join(lines)


def _plot_fanout(report: Report, path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    bars = fanout_bars(report.fanout)
    figure = Figure(figsize=(8, 4), layout="constrained")
    axes = figure.subplots()
    axes.bar([label for label, _ in bars], [count for _, count in bars], color="#4c72b0")
    axes.set_xlabel("subscribers reached by a publish")
    axes.set_ylabel("publishes")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title("Fan-out")
    axes.tick_params(axis="x", labelrotation=45 if len(bars) > 12 else 0)
    figure.savefig(path, dpi=100)


def _plot_per_node(report: Report, path: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    names = [n.node for n in report.per_node]
    positions = range(len(names))
    width = 0.27
    figure = Figure(figsize=(max(6.0, 1.2 * len(names) + 2), 4), layout="constrained")
    axes = figure.subplots()
    series = [
        ("published", [n.published for n in report.per_node], "#4c72b0"),
        ("copies sent", [n.sent_copies for n in report.per_node], "#dd8452"),
        ("copies received", [n.received_copies for n in report.per_node], "#55a868"),
    ]
    for offset, (label, values, color) in enumerate(series):
        axes.bar(
            [p + (offset - 1) * width for p in positions], values, width, label=label, color=color
        )
    axes.set_xticks(list(positions), names, rotation=30 if len(names) > 6 else 0)
    axes.set_ylabel("messages")
    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title("Traffic per node")
    axes.legend()
    figure.savefig(path, dpi=100)


def write_summary(report: Report, directory: Path) -> list[str]:
    """Write ``summary.md`` and the two plots into ``directory``; returns their names."""
    (directory / SUMMARY).write_text(summary_markdown(report) + "\n", encoding="utf-8")
    _plot_fanout(report, directory / FANOUT_PLOT)
    _plot_per_node(report, directory / PER_NODE_PLOT)
    return [SUMMARY, FANOUT_PLOT, PER_NODE_PLOT]
