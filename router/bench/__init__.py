"""Workloads behind ``router bench``: each measures the router beside a peer in one run."""
