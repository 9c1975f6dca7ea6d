"""Prometheus metrics at ``GET /metrics`` for the operator's Prometheus.

Every figure is read from the database at scrape time by a few aggregate queries, so any web process answers
the same. The collector is registered on its own ``CollectorRegistry`` (not the process-global one), so the
scrape holds only the broker's figures.

Access: a request from a loopback address that no proxy forwarded, or one carrying
``Authorization: Bearer <METRICS_TOKEN>``; anything else gets 403.
"""

from __future__ import annotations

import datetime as dt
import hmac
import ipaddress
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, OuterRef, Q, Subquery, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ledger.models import Anchor, Checkpoint, LedgerHead
from ledger.services import ledger_queued
from marketplace.fleets.selectors import LIVE_STATES as FLEET_LIVE_STATES
from marketplace.fleets.selectors import fleets_spent_usd
from marketplace.models import (
    Attempt,
    AttemptOutcome,
    BookLine,
    Fleet,
    FleetDecision,
    FleetState,
    Instance,
    LeaseHeartbeat,
    LeaseState,
    MismatchKind,
    Offer,
    OfferStatus,
    Order,
    OrderHealth,
    OrderState,
    OutageCause,
    Payout,
    PayoutState,
    PeriodicRun,
    ReconciliationMismatch,
    ReconciliationRun,
    TopUp,
    TopUpState,
)
from marketplace.money import from_minor
from marketplace.sla.selectors import credits_posted, open_outages_by_cause, orders_below_sla
from providers.models import Machine, MachineHeartbeat, ProviderAccount, ProviderKind, SyncStatus

# Seconds from placement until an order's machine was first ready.
PROVISIONING_BUCKETS: tuple[int, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1200)

# A request carrying one of these came through a proxy: its loopback REMOTE_ADDR is the proxy's, not the client's.
_FORWARDING_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


class BrokerCollector:
    """Yields the broker's metric families, computed from the database on every ``collect()``."""

    def describe(self) -> list[Metric]:
        # Nothing to describe up front: registering must not query the database.
        return []

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        yield from self._offers()
        yield from self._accounts(now)
        yield from self._orders()
        yield from self._provisioning()
        yield from self._ledger(now)
        yield from self._machines()
        yield from self._leases()
        yield from self._jobs(now)
        yield from self._money(now)
        yield from self._fleets(now)
        yield from self._slas(now)

    # --- Catalogue and accounts ------------------------------------------------------------------------------

    def _offers(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "broker_offers", "Offers in the catalogue by provider kind and status.", labels=["provider", "status"]
        )
        counts = {
            (row["account__kind"], row["status"]): row["n"]
            for row in Offer.objects.order_by().values("account__kind", "status").annotate(n=Count("pk"))
        }
        kinds = set(ProviderAccount.objects.order_by().values_list("kind", flat=True).distinct())
        kinds |= {kind for kind, _ in counts}
        for kind in sorted(kinds):
            for status in OfferStatus.values:
                family.add_metric([kind, status], counts.get((kind, status), 0))
        yield family

    def _accounts(self, now: dt.datetime) -> Iterator[Metric]:
        labels = ["account", "provider", "seller"]
        age = GaugeMetricFamily(
            "broker_offer_sync_age_seconds",
            "Seconds since the account's offers were last synced successfully (enabled accounts that synced once).",
            labels=labels,
        )
        failed = GaugeMetricFamily(
            "broker_offer_sync_failed",
            "1 when the account's last offer sync failed, else 0 (enabled accounts).",
            labels=labels,
        )
        rows = (
            ProviderAccount.objects.filter(enabled=True)
            .order_by("provider__name", "name")
            .values("name", "kind", "provider__name", "sync_status", "last_synced_at")
        )
        for row in rows:
            values = [row["name"], row["kind"], row["provider__name"]]
            if row["last_synced_at"] is not None:
                age.add_metric(values, max(0.0, (now - row["last_synced_at"]).total_seconds()))
            failed.add_metric(values, 1 if row["sync_status"] == SyncStatus.FAILED else 0)
        yield age
        yield failed

    # --- Orders and provisioning -----------------------------------------------------------------------------

    def _orders(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("broker_orders", "Orders by state.", labels=["state"])
        rows = (
            Order.objects.order_by()
            .values_list("state")
            .annotate(n=Count("pk"), degraded=Count("pk", filter=Q(health=OrderHealth.DEGRADED)))
        )
        counts = {state: (n, degraded) for state, n, degraded in rows}
        for state in OrderState.values:
            family.add_metric([state], counts.get(state, (0, 0))[0])
        yield family
        # Only running orders: leaving running makes an order healthy again, so any other state is noise.
        yield GaugeMetricFamily(
            "broker_orders_degraded",
            "Running orders whose lease agent fell silent (degraded): alert when above 0 for minutes.",
            value=counts.get(OrderState.RUNNING, (0, 0))[1],
        )

    # --- Fleets ---------------------------------------------------------------------------------------------------

    def _fleets(self, now: dt.datetime) -> Iterator[Metric]:
        """Each active fleet by its public id (its name is the buyer's text): its live replicas by state, what it
        wants and its bounds, and what its budget has left; and every kept decision by action."""
        replicas = GaugeMetricFamily(
            "broker_fleet_replicas", "Active fleets' live replicas by order state.", labels=["fleet", "state"]
        )
        desired = GaugeMetricFamily("broker_fleet_replicas_desired", "What the fleet's last decision asked for.",
                                    labels=["fleet"])  # fmt: skip
        most = GaugeMetricFamily("broker_fleet_replicas_max", "The fleet's maximum replicas.", labels=["fleet"])
        least = GaugeMetricFamily("broker_fleet_replicas_min", "The fleet's minimum replicas.", labels=["fleet"])
        budget = GaugeMetricFamily(
            "broker_fleet_budget_remaining_usd",
            "What the fleet's budget has left (USD), fleets with a budget only.",
            labels=["fleet"],
        )
        fleets = list(Fleet.objects.filter(state=FleetState.ACTIVE).order_by("pk"))
        live = (
            Order.objects.filter(fleet__in=fleets, state__in=FLEET_LIVE_STATES)
            .order_by()
            .values_list("fleet_id", "state")
            .annotate(n=Count("pk"))
        )
        counts = {(fleet_id, state): n for fleet_id, state, n in live}
        budgeted = [f.pk for f in fleets if f.budget_usd is not None]
        spent = fleets_spent_usd(fleet_ids=budgeted, now=now)
        for fleet in fleets:
            label = str(fleet.public_id)
            for state in FLEET_LIVE_STATES:
                replicas.add_metric([label, state], counts.get((fleet.pk, state), 0))
            desired.add_metric([label], fleet.desired)
            most.add_metric([label], fleet.max_replicas)
            least.add_metric([label], fleet.min_replicas)
            if fleet.budget_usd is not None:
                budget.add_metric([label], float(fleet.budget_usd - spent.get(fleet.pk, Decimal(0))))
        yield from (replicas, desired, most, least, budget)
        decisions = CounterMetricFamily(
            "broker_fleet_decisions", "Fleet scaling decisions kept, by action.", labels=["action"]
        )
        for action, n in FleetDecision.objects.order_by().values_list("action").annotate(n=Count("pk")):
            decisions.add_metric([action], n)
        yield decisions

    # --- SLAs ----------------------------------------------------------------------------------------------------

    def _slas(self, now: dt.datetime) -> Iterator[Metric]:
        """What the broker measures of its sellers' promises: outages still open by cause (every cause shown,
        zeros too, so an alert sees one end), running orders below their SLA this month by provider kind, and
        the credits paid so far."""
        outages = GaugeMetricFamily(
            "broker_sla_outages_open", "Outages of running orders still open, by cause.", labels=["cause"]
        )
        open_now = open_outages_by_cause()
        for cause in OutageCause.values:
            outages.add_metric([cause], open_now.get(cause, 0))
        below = GaugeMetricFamily(
            "broker_sla_orders_below",
            "Running orders whose measured availability this month is below their SLA, by provider kind.",
            labels=["provider"],
        )
        counts = orders_below_sla(now=now)
        for kind in ProviderKind.values:
            below.add_metric([kind], counts.get(kind, 0))
        count, total_minor = credits_posted()
        yield from (outages, below)
        yield CounterMetricFamily("broker_sla_credits", "SLA credits paid to buyers.", value=count)
        yield CounterMetricFamily(
            "broker_sla_credits_usd", "USD paid to buyers as SLA credits.", value=float(from_minor(total_minor, "USD"))
        )

    def _provisioning(self) -> Iterator[Metric]:
        attempts = CounterMetricFamily(
            "broker_provisioning_attempts",
            "Finished launch attempts by outcome (launched, failed) and error class (empty when launched).",
            labels=["outcome", "error_class"],
        )
        rows = (
            Attempt.objects.exclude(outcome=AttemptOutcome.PENDING)
            .order_by()
            .values_list("outcome", "error_class")
            .annotate(n=Count("pk"))
        )
        for outcome, error_class, n in rows:
            attempts.add_metric([outcome, error_class], n)
        yield attempts

        failovers = Attempt.objects.filter(outcome=AttemptOutcome.LAUNCHED, number__gt=1).aggregate(
            n=Count("order", distinct=True)
        )["n"]
        yield CounterMetricFamily(
            "broker_failovers",
            "Orders that launched on a later attempt than their first (a launched attempt numbered above 1).",
            value=failovers,
        )

        # Per order, the first time one of its instances was ready (what the buyer waits for): a re-provisioned
        # order (after a preemption) counts once, with its first launch.
        first_running = (
            Instance.objects.filter(order=OuterRef("pk"), ready_at__isnull=False)
            .order_by("ready_at")
            .values("ready_at")[:1]
        )
        ran = Order.objects.annotate(first_running=Subquery(first_running)).filter(first_running__isnull=False)
        aggregates: dict[str, Any] = {
            f"le_{b}": Count("pk", filter=Q(first_running__lte=F("created_at") + dt.timedelta(seconds=b)))
            for b in PROVISIONING_BUCKETS
        }
        figures = ran.aggregate(
            total=Count("pk"),
            seconds=Sum(ExpressionWrapper(F("first_running") - F("created_at"), output_field=DurationField())),
            **aggregates,
        )
        buckets = [(str(float(b)), figures[f"le_{b}"]) for b in PROVISIONING_BUCKETS]
        buckets.append(("+Inf", figures["total"]))
        seconds = figures["seconds"]
        yield HistogramMetricFamily(
            "broker_provisioning_seconds",
            "Seconds from an order's placement until its first machine was ready for the buyer (failovers included).",
            buckets=buckets,
            sum_value=seconds.total_seconds() if seconds is not None else 0.0,
        )

    # --- Ledger ----------------------------------------------------------------------------------------------

    def _ledger(self, now: dt.datetime) -> Iterator[Metric]:
        size = LedgerHead.objects.order_by().aggregate(size=Max("size"))["size"] or 0
        yield GaugeMetricFamily("broker_ledger_entries", "Entries in the append-only ledger.", value=size)
        queued, oldest = ledger_queued()
        yield GaugeMetricFamily(
            "broker_ledger_queued_entries", "Entries written but not yet chained by the sequencer.", value=queued
        )
        yield GaugeMetricFamily(
            "broker_ledger_queued_age_seconds",
            "Seconds the oldest queued entry has waited for the sequencer (0 when none waits).",
            value=0.0 if oldest is None else max(0.0, (now - oldest).total_seconds()),
        )

        checkpoint = Checkpoint.objects.order_by().aggregate(size=Max("size"))["size"]
        if checkpoint is not None:
            yield GaugeMetricFamily(
                "broker_ledger_checkpoint_size",
                "Ledger size covered by the latest signed checkpoint.",
                value=checkpoint,
            )
        anchored = Anchor.objects.order_by().aggregate(at=Max("anchored_at"))["at"]
        if anchored is not None:
            yield GaugeMetricFamily(
                "broker_ledger_last_anchor_age_seconds",
                "Seconds since the latest checkpoint was anchored on chain.",
                value=max(0.0, (now - anchored).total_seconds()),
            )

    # --- Independent providers' machines ---------------------------------------------------------------------

    def _machines(self) -> Iterator[Metric]:
        labels = ["machine", "account", "provider", "seller"]
        online = GaugeMetricFamily(
            "broker_machine_online", "1 when the listed machine's agent is online, else 0.", labels=labels
        )
        utilization = GaugeMetricFamily(
            "broker_machine_gpu_utilization_percent",
            "Mean GPU utilization in the online machine's latest heartbeat.",
            labels=labels,
        )
        temperature = GaugeMetricFamily(
            "broker_machine_gpu_temperature_celsius",
            "Hottest GPU temperature in the online machine's latest heartbeat.",
            labels=labels,
        )
        power = GaugeMetricFamily(
            "broker_machine_power_watts",
            "Total GPU power draw in the online machine's latest heartbeat.",
            labels=labels,
        )
        latest = MachineHeartbeat.objects.filter(machine=OuterRef("machine")).order_by("-at", "-pk").values("pk")[:1]
        beats = {
            row["machine_id"]: row
            for row in MachineHeartbeat.objects.filter(machine__online=True, pk=Subquery(latest)).values(
                "machine_id", "utilization_pct", "temperature_c", "power_w"
            )
        }
        machines = Machine.objects.order_by("account__provider__name", "account__name", "name").values_list(
            "pk", "name", "account__name", "account__kind", "account__provider__name", "online"
        )
        for pk, name, account, kind, seller, is_online in machines:
            values = [name, account, kind, seller]
            online.add_metric(values, 1 if is_online else 0)
            beat = beats.get(pk)
            if is_online and beat is not None:
                utilization.add_metric(values, float(beat["utilization_pct"]))
                temperature.add_metric(values, float(beat["temperature_c"]))
                power.add_metric(values, float(beat["power_w"]))
        yield online
        yield utilization
        yield temperature
        yield power

    # --- Rented machines, on every provider kind, from their lease agents -------------------------------------

    def _leases(self) -> Iterator[Metric]:
        labels = ["order", "provider", "instance_type", "region", "gpu_model"]
        families = {
            "utilization_pct": GaugeMetricFamily(
                "broker_order_gpu_utilization_percent",
                "Mean GPU utilization of a running order's machine, in its lease agent's latest heartbeat.",
                labels=labels,
            ),
            "temperature_c": GaugeMetricFamily(
                "broker_order_gpu_temperature_celsius",
                "Hottest GPU temperature of a running order's machine, in its lease agent's latest heartbeat.",
                labels=labels,
            ),
            "power_w": GaugeMetricFamily(
                "broker_order_gpu_power_watts",
                "Total GPU power draw of a running order's machine, in its lease agent's latest heartbeat.",
                labels=labels,
            ),
        }
        latest = LeaseHeartbeat.objects.filter(lease=OuterRef("lease")).order_by("-at", "-pk").values("pk")[:1]
        rows = LeaseHeartbeat.objects.filter(
            pk=Subquery(latest), lease__state=LeaseState.READY, lease__order__state=OrderState.RUNNING
        ).values(
            "utilization_pct", "temperature_c", "power_w", "lease__order__public_id",
            "lease__attempt__offer__account__kind", "lease__attempt__offer__instance_type",
            "lease__attempt__offer__region", "lease__order__gpu_model__key",
        )  # fmt: skip
        for row in rows:
            values = [
                str(row["lease__order__public_id"]), row["lease__attempt__offer__account__kind"],
                row["lease__attempt__offer__instance_type"], row["lease__attempt__offer__region"],
                row["lease__order__gpu_model__key"],
            ]  # fmt: skip
            for field, family in families.items():
                family.add_metric(values, float(row[field]))
        yield from families.values()

    # --- Periodic jobs (issue 23) ----------------------------------------------------------------------------

    def _jobs(self, now: dt.datetime) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            "broker_periodic_runs", "Runs of each periodic job that did its work.", labels=["job"]
        )
        skipped = CounterMetricFamily(
            "broker_periodic_skipped",
            "Runs of each periodic job that skipped: another run held it or had just run (a second beat).",
            labels=["job"],
        )
        running = GaugeMetricFamily(
            "broker_periodic_running", "1 while a run of the job holds its lease.", labels=["job"]
        )
        age = GaugeMetricFamily(
            "broker_periodic_last_start_age_seconds", "Seconds since the job's latest run began.", labels=["job"]
        )
        for job in PeriodicRun.objects.order_by("name"):
            runs.add_metric([job.name], job.runs)
            skipped.add_metric([job.name], job.skipped)
            holding = bool(job.holder) and job.lease_until is not None and job.lease_until > now
            running.add_metric([job.name], 1.0 if holding else 0.0)
            if job.last_started_at is not None:
                age.add_metric([job.name], max(0.0, (now - job.last_started_at).total_seconds()))
        yield from (runs, skipped, running, age)

    # --- Money (issue 22) ------------------------------------------------------------------------------------

    def _money(self, now: dt.datetime) -> Iterator[Metric]:
        topups = GaugeMetricFamily("broker_topups", "Card top-ups by state.", labels=["state"])
        counted = dict(TopUp.objects.order_by().values_list("state").annotate(n=Count("pk")))
        for state in TopUpState.values:
            topups.add_metric([state], counted.get(state, 0))
        payouts = GaugeMetricFamily("broker_payouts", "Provider payouts by state.", labels=["state"])
        counted = dict(Payout.objects.order_by().values_list("state").annotate(n=Count("pk")))
        for state in PayoutState.values:
            payouts.add_metric([state], counted.get(state, 0))
        balances = GaugeMetricFamily(
            "broker_book_balance",
            "Sum of the book's accounts of each kind, in major units (credit accounts are negative).",
            labels=["kind", "currency"],
        )
        imbalance = GaugeMetricFamily(
            "broker_book_imbalance",
            "Sum of the whole book per currency, in minor units: 0 unless broken.",
            labels=["currency"],
        )
        totals: dict[str, int] = {}
        for row in (
            BookLine.objects.order_by().values("account__kind", "account__currency").annotate(total=Sum("amount_minor"))
        ):
            balances.add_metric([row["account__kind"], row["account__currency"]], int(row["total"]) / 100)
            totals[row["account__currency"]] = totals.get(row["account__currency"], 0) + int(row["total"])
        for currency, total in sorted(totals.items()):
            imbalance.add_metric([currency], total)
        yield from (topups, payouts, balances, imbalance)
        yield from self._reconciliation(now)

    def _reconciliation(self, now: dt.datetime) -> Iterator[Metric]:
        mismatches = GaugeMetricFamily(
            "broker_reconciliation_mismatches",
            "Disagreements between Stripe and the book not yet reviewed by staff, by kind: alert above 0.",
            labels=["kind"],
        )
        counted = dict(
            ReconciliationMismatch.objects.filter(reviewed_at__isnull=True)
            .order_by()
            .values_list("kind")
            .annotate(n=Count("pk"))
        )
        for kind in MismatchKind.values:
            mismatches.add_metric([kind], counted.get(kind, 0))
        age = GaugeMetricFamily(
            "broker_reconciliation_age_seconds",
            "Seconds since a reconciliation last finished (absent before the first): alert when it stops running.",
        )
        last = ReconciliationRun.objects.filter(finished_at__isnull=False).aggregate(last=Max("finished_at"))["last"]
        if last is not None:
            age.add_metric([], max(0.0, (now - last).total_seconds()))
        yield from (mismatches, age)


registry = CollectorRegistry(auto_describe=False)
registry.register(BrokerCollector())


def metrics_allowed(request: HttpRequest) -> bool:
    """A configured token that the request carries, or a loopback address that no proxy forwarded.
    A request carrying a bearer token is judged by that token alone: a wrong one is refused even from loopback."""
    token = getattr(settings, "METRICS_TOKEN", "") or ""
    header = request.headers.get("Authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() == "bearer" and presented.strip():
        return bool(token) and hmac.compare_digest(presented.strip().encode(), token.encode())
    if any(request.META.get(name) for name in _FORWARDING_HEADERS):
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        return HttpResponse("forbidden\n", status=403, content_type="text/plain; charset=utf-8")
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
