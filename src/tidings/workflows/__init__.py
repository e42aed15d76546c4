"""Workflows built on the moves: chains, batches, unique and debounced jobs, cron
schedules, and the hooks the worker calls around a job (``hooks``)."""
