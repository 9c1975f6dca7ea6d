"""The Grafana dashboard shipped in deploy/grafana/ (issue 23, point 5; fleets and SLAs, issue 38): every panel
queries metrics the broker exports at /metrics (or that issue 38 names for collectors still to come), by labels
those metrics carry."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from ledger.checkpoints import ledger_checkpoint_and_anchor
from marketplace.billing.book import Line, book_account, book_post
from marketplace.jobs import periodic_claim, periodic_release
from marketplace.models import BookAccountKind
from providers.models import ProviderAccount
from tests.pending_metrics import PENDING_METRICS

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "broker.json"
_METRIC = re.compile(r"\bbroker_[a-z0-9_]+")
_BY = re.compile(r"\bby \(([^)]*)\)")
_MATCHERS = re.compile(r"\{([^}]*)\}")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total")

pytestmark = pytest.mark.django_db


def _panels() -> list[dict]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def _family(sample_name: str, families: set[str]) -> str:
    if sample_name in families:
        return sample_name
    for suffix in _SUFFIXES:
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in families:
            return sample_name[: -len(suffix)]
    return sample_name


def test_the_dashboard_is_a_grafana_dashboard_with_queries():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    panels = _panels()
    assert len(panels) >= 20
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert all(target["expr"].strip() for target in panel["targets"]), panel["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_every_panel_queries_metrics_and_labels_the_broker_exports(client, acme, aws_account):
    ProviderAccount.objects.filter(pk=aws_account.pk).update(last_synced_at=timezone.now(), sync_status="ok")
    credit = book_account(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=acme)
    cash = book_account(kind=BookAccountKind.CASH, currency="USD")
    book_post(kind="topup", key="dashboard", lines=[Line(cash, 5000), Line(credit, -5000)])  # ledgered too
    ledger_checkpoint_and_anchor()  # the checkpoint and anchor families appear once there is one
    holder = periodic_claim("orders-sweep", lease_s=60)
    assert holder is not None
    periodic_release("orders-sweep", holder)
    scrape = client.get("/metrics").content.decode()
    families = {}
    for family in text_string_to_metric_families(scrape):
        labels = {label for sample in family.samples for label in sample.labels if label != "le"}
        families[family.name] = labels
    names = set(families)
    used: set[str] = set()
    for panel in _panels():
        for target in panel["targets"]:
            expr = target["expr"]
            metrics = {_family(name, names) for name in _METRIC.findall(expr)}
            assert metrics, (panel["title"], expr)
            missing = metrics - names - set(PENDING_METRICS)
            assert not missing, f"{panel['title']}: {sorted(missing)} is not exported"
            used |= metrics
            wanted = {label.strip() for group in _BY.findall(expr) for label in group.split(",") if label.strip()}
            wanted |= {m.split("=")[0].strip() for group in _MATCHERS.findall(expr) for m in group.split(",") if m}
            labelled = {**PENDING_METRICS, **families}
            known = set().union(*(labelled[m] for m in metrics))
            # A family without samples in this world shows no labels: only those with samples are checked.
            if all(labelled[m] for m in metrics):
                assert wanted <= known, f"{panel['title']}: labels {sorted(wanted - known)} are not on {metrics}"
    # The dashboard leaves no exported family out but the process-level ones.
    assert names - used == set(), f"not on the dashboard: {sorted(names - used)}"


def test_the_fleets_and_slas_rows_show_replicas_decisions_budgets_outages_and_credits():
    dashboard = json.loads(DASHBOARD.read_text())
    rows: dict[str, list[str]] = {}
    current = None
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            current = rows.setdefault(panel["title"], [])
        else:
            assert current is not None
            current.extend(target["expr"] for target in panel["targets"])
    fleets = {name for expr in rows["Fleets"] for name in _METRIC.findall(expr)}
    assert fleets == {
        "broker_fleet_replicas", "broker_fleet_replicas_desired", "broker_fleet_replicas_max",
        "broker_fleet_replicas_min", "broker_fleet_decisions_total", "broker_fleet_budget_remaining_usd",
    }  # fmt: skip
    slas = {name for expr in rows["SLAs"] for name in _METRIC.findall(expr)}
    assert slas == {
        "broker_sla_outages_open", "broker_sla_orders_below",
        "broker_sla_credits_total", "broker_sla_credits_usd_total",
    }  # fmt: skip
    # Every pending metric is on the dashboard, so the cross-check above covers it the day its collector lands.
    assert set(PENDING_METRICS) <= fleets | slas
    # No panel overlaps another.
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        mine = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, panel["title"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        cells |= mine
