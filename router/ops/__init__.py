"""Operator tools built on the layers below: route and channel views, reconcile, the demo,
an embedded Redis, short-lived nodes for CLI commands, and settings of a node process.
"""
