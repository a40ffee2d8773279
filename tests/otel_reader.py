"""One OpenTelemetry SDK reader for the whole test process.

The global meter provider can be set once per process; every test that checks
metrics reads this reader and compares values before and after what it did.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

__all__ = ["points", "reader", "total"]


@cache
def reader() -> InMemoryMetricReader:
    found = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[found]))
    return found


def points(name: str) -> list[Any]:
    """Every data point of the metric ``name`` in one collection (cumulative)."""
    data = reader().get_metrics_data()
    found: list[Any] = []
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def total(name: str, **attributes: object) -> float:
    """The sum (counters) or count (histograms) of the points matching ``attributes``."""
    result: float = 0
    for point in points(name):
        if all(point.attributes.get(k) == v for k, v in attributes.items()):
            result += point.count if hasattr(point, "count") else point.value
    return result
