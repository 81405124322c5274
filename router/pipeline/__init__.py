"""Batch work over routing data on Spark (PySpark): ``router pipeline report|export|import``.

The jobs run on ``local[*]`` by default and on any Spark cluster (``--master``); they need
the ``spark`` extra (``pip install 'router[spark]'``) and Java 17 or newer. pyspark is
imported only inside this package, and only by the modules that run Spark
(:mod:`~router.pipeline.spark_session`, :mod:`~router.pipeline.report`,
:mod:`~router.pipeline.sources`, :mod:`~router.pipeline.export`,
:mod:`~router.pipeline.importer`); the rest is plain Python that the executors call:

* :mod:`~router.pipeline.model`: the report's figures as plain values;
* :mod:`~router.pipeline.matching`: fan-out and matched filters of a topic, with the
  project's own :class:`~router.core.trie.SubscriptionTrie`;
* :mod:`~router.pipeline.plain`: the same report computed in one Python process (the
  benchmark's peer and a cross-check);
* :mod:`~router.pipeline.summary`: the Markdown summary and its PNG plots;
* :mod:`~router.pipeline.snapshot`: subscriptions, routes and retained messages read from
  Redis in bounded batches;
* :mod:`~router.pipeline.loader`: validating import rows and writing one client per
  script call.

Executors import ``router`` too: on a real cluster install the package (with the extra)
on every worker.
"""
