"""Metrics issue 38 names for the fleet and SLA collectors, which are added to broker/metrics.py with those
features: until then the dashboard and the alerting rules may name them though no scrape shows them yet. Each
maps to the labels its series carry. Delete an entry when its collector lands (the checks then read the scrape)."""

from __future__ import annotations

PENDING_METRICS: dict[str, frozenset[str]] = {
    "broker_sla_outages_open": frozenset({"cause"}),
    "broker_sla_orders_below": frozenset({"provider"}),
    "broker_sla_credits_total": frozenset(),
    "broker_sla_credits_usd_total": frozenset(),
}
