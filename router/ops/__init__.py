"""Operator tools built on the layers below: route and channel views, reconcile, the demo,
an embedded Redis, child processes that serve something (start, wait, stop), short-lived
nodes for CLI commands, and a node process: its settings, where it takes its users and
rules, and ``run_node``.
"""
