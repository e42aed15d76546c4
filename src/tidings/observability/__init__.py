"""Seeing what runs: lifecycle events, metrics and heartbeats, Prometheus text, traces,
and the redaction and terminal escaping every output passes through."""
