"""Suites of other projects, vendored: each runs in a pytest of its own, with its own options
(tests/system/test_conformance_zmqtt.py starts the nodes and runs the zMQTT one), never in
the project's collection: their ``tests`` package would clash with ours."""

collect_ignore = ["zmqtt"]
