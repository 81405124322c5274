"""Spark schemas of what the pipeline reads and writes."""

from __future__ import annotations

from typing import Final

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

TRAFFIC: Final = StructType(
    [
        StructField("time", DoubleType()),
        StructField("node", StringType()),
        StructField("topic", StringType()),
        StructField("payload_bytes", LongType()),
        StructField("qos", IntegerType()),
        StructField("retain", BooleanType()),
        StructField("forwarded", ArrayType(StringType())),
        StructField("local_deliveries", LongType()),
    ]
)
"""One traffic-log record (:mod:`router.cluster.traffic_log` writes them, fields in this order)."""

MATCHED: Final = StructType(
    [
        StructField("kind", IntegerType(), False),
        StructField("name", StringType(), False),
        StructField("messages", LongType(), False),
        StructField("bytes", LongType(), False),
        StructField("subscribers", LongType(), False),
        StructField("deliveries", LongType(), True),
    ]
)
"""What the executors' matching step returns (see :mod:`router.pipeline.report`): per
distinct topic (``kind`` 0), its publishes, their payload bytes and the subscribers each
reached (``deliveries`` null); per filter the topics of one partition matched (``kind``
1), the publishes it matched, the payload bytes it delivered, its subscribers and the
copies it produced. A filter has a row per partition that matched it."""

SUBSCRIPTION: Final = StructType(
    [
        StructField("client_id", StringType(), False),
        StructField("filter", StringType(), False),
        StructField("qos", IntegerType(), False),
        StructField("no_local", BooleanType(), False),
        StructField("retain_as_published", BooleanType(), False),
        StructField("retain_handling", IntegerType(), False),
        StructField("subscription_identifier", LongType(), True),
    ]
)
"""One stored subscription, as exported (and accepted by import)."""

ROUTE: Final = StructType(
    [
        StructField("node_id", StringType(), False),
        StructField("route", StringType(), False),
        StructField("members", LongType(), False),
        StructField("generation", StringType(), True),
        StructField("version", LongType(), False),
    ]
)
"""One route of a node's route set, with the set's generation and version."""

RETAINED: Final = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("payload", BinaryType(), False),
        StructField("qos", IntegerType(), False),
        StructField("message_id", BinaryType(), True),
        StructField("publisher", StringType(), True),
        StructField("expiry_interval", LongType(), True),
    ]
)
"""One retained message (``expiry_interval``: seconds left, null when it never expires)."""
