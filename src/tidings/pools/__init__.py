"""Worker pools per set of queues, balanced by measured wait across hosts.

:mod:`~tidings.pools.spec` (what a pool is), :mod:`~tidings.pools.balancer` (pure:
measured load in, processes per pool out), :mod:`~tidings.pools.plan` (pure: the split
across hosts), :mod:`~tidings.pools.coordination` (Redis: reports, leader lease, plan),
:mod:`~tidings.pools.supervise` (the host's supervisor of child processes).
"""

from tidings.pools.spec import Pool, PoolsConfig

__all__ = ["Pool", "PoolsConfig"]
