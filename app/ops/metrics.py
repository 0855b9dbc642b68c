"""The control plane's Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

HTTP_REQUESTS = Counter(
    "nebula_http_requests_total",
    "HTTP requests answered, by method, route template and status.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
HTTP_LATENCY = Histogram(
    "nebula_http_request_seconds",
    "HTTP request latency by route template.",
    ["route"],
    registry=REGISTRY,
)
ADMISSIONS = Counter(
    "nebula_admissions_total",
    "Requests past the admission middleware: admitted to a slot, or refused before one "
    "(a signed-in route's request without a live credential).",
    ["outcome"],
    registry=REGISTRY,
)
