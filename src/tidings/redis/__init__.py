"""Talking to Redis: clients for a URL, Sentinel or Cluster, which errors mean "not now",
every key name, the one registry of Lua scripts (``lua/``), the producer's fast path.

Nothing here knows what a job is: the moves (:mod:`tidings.moves`) give the scripts
their meaning."""
