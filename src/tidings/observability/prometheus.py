"""Prometheus text for the dashboard's ``/metrics`` and ``notify-worker --metrics-port``.

Needs ``prometheus-client`` (``pip install 'tidings[metrics]'``). Families::

    tidings_jobs_processed_total{queue,job_class}   counter
    tidings_jobs_failed_total{queue,job_class}      counter
    tidings_jobs_released_total{queue,job_class}    counter
    tidings_jobs_stalled_total{queue,job_class}     counter (lease lost while running)
    tidings_job_runtime_seconds{queue,job_class}    histogram
    tidings_job_wait_seconds{queue,job_class}       histogram (dispatch or due -> start)
    tidings_queue_jobs{queue,state}                 gauge: ready, delayed, reserved, failed
    tidings_workers_alive                           gauge

The dashboard reports every worker's counts (the ``:total`` hashes in Redis); a
worker's own endpoint reports what that process ran since it started.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

from tidings.observability.metrics import HIST_MS, Counts, live_workers, totals

log = logging.getLogger("tidings.observability.metrics")

_COUNTERS = (
    ("processed", "Jobs run to completion"),
    ("failed", "Jobs that went to the failed store"),
    ("released", "Runs that put their job back for later (retries, releases)"),
    ("stalled", "Runs whose lease expired while running (may run elsewhere too)"),
)


def _import() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "Prometheus metrics need prometheus-client: pip install 'tidings[metrics]'"
        ) from exc
    return prometheus_client


def _histogram(hist: list[int], total_us: float, family: Any, labels: list[str]) -> None:
    running = 0
    buckets: list[tuple[str, float]] = []
    for le, n in zip(HIST_MS, hist, strict=False):
        running += n
        buckets.append((repr(le / 1000), float(running)))
    running += hist[-1]
    buckets.append(("+Inf", float(running)))
    family.add_metric(labels, buckets, total_us / 1e6)


def families(
    counts: Mapping[tuple[str, str], Counts],
    sizes: Mapping[str, Mapping[str, int]],
    workers: int | None,
) -> Iterator[Any]:
    """Metric families from per-(queue, class) counts, queue sizes and live workers."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    labels = ["queue", "job_class"]
    for attr, doc in _COUNTERS:
        fam = CounterMetricFamily(f"tidings_jobs_{attr}", doc, labels=labels)
        for (queue, cls), c in sorted(counts.items()):
            fam.add_metric([queue, cls], float(getattr(c, attr)))
        yield fam
    run = HistogramMetricFamily("tidings_job_runtime_seconds", "Job run time", labels=labels)
    wait = HistogramMetricFamily(
        "tidings_job_wait_seconds", "Wait from dispatch (or due time) to start", labels=labels
    )
    for (queue, cls), c in sorted(counts.items()):
        if c.runtime_n:
            _histogram(c.runtime_hist, c.runtime_us, run, [queue, cls])
        if c.wait_n:
            _histogram(c.wait_hist, c.wait_us, wait, [queue, cls])
    yield run
    yield wait
    depth = GaugeMetricFamily("tidings_queue_jobs", "Jobs in a queue by state",
                              labels=["queue", "state"])  # fmt: skip
    for queue, s in sorted(sizes.items()):
        for state in ("ready", "delayed", "reserved", "failed"):
            depth.add_metric([queue, state], float(s.get(state, 0)))
    yield depth
    if workers is not None:
        yield GaugeMetricFamily("tidings_workers_alive", "Workers heartbeating now",
                                value=float(workers))  # fmt: skip


class _Collector:
    def __init__(self, read: Any) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        try:
            counts, sizes, workers = self.read()
        except Exception as exc:  # a scrape during a Redis outage: report what we can
            log.warning("metrics scrape: %s: %s", type(exc).__name__, exc)
            counts, sizes, workers = {}, {}, None
        yield from families(counts, sizes, workers)


def dashboard_text(app: Any) -> tuple[bytes, str]:
    """The Prometheus exposition of every worker's measurements (from Redis)."""
    pc = _import()
    from tidings.observability.metrics import measured_queues

    rq = app.queue_for(None)

    def read() -> tuple[Any, Any, Any]:
        names = sorted(set(rq.queue_names()) | set(measured_queues(rq.client, rq.prefix)))
        return (totals(rq.client, rq.prefix, names), rq.sizes(names) if names else {},
                len(live_workers(rq.client, rq.prefix)))  # fmt: skip

    registry = pc.CollectorRegistry(auto_describe=False)
    registry.register(_Collector(read))
    return pc.generate_latest(registry), pc.CONTENT_TYPE_LATEST


def serve_worker_metrics(app: Any, queues: list[str], port: int, host: str = "127.0.0.1") -> Any:
    """Serve this worker process's metrics on ``host:port`` (a daemon thread)."""
    pc = _import()
    rq = app.queue_for(None)

    def read() -> tuple[Any, Any, Any]:
        meter = getattr(app, "_meter", None)
        counts = dict(meter.totals) if meter is not None else {}
        return counts, rq.sizes(queues), len(live_workers(rq.client, rq.prefix))

    registry = pc.CollectorRegistry(auto_describe=False)
    registry.register(_Collector(read))
    return pc.start_http_server(port, addr=host, registry=registry)
