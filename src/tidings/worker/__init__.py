"""``notify-worker``'s worker: composed parts, one object each (see ``worker.py``)."""
