"""Every change a job goes through in Redis, each one Lua script safe to run twice:
pushes (``queues``, ``push_once``), the worker's pop, ack, release, fail and extend
(``consume``), and the operator's failed-store commands (``queues``)."""
