"""Jobs that span machines: a cluster of ``nodes`` instances of one offer, placed, launched and ended as one.

Each node is an ordinary order (``Order.cluster``), so a node is launched, booted, metered, lost and
terminated by the order machinery. What this module adds is the group's rule, all or nothing:

- A round is one try on one offer: ``nodes`` orders, none of which may fail over alone (another zone
  would split the group across networks).
- The cluster runs when every order of its round runs (each is usable: its agent reported ready).
- When an order of the round fails (its launch ran out of capacity, its machine never booted, the provider
  took it), the round's other orders are terminated, so nothing half-launched is left running, and the
  whole group is tried on the next best offer, one that every node fits, up to ``MAX_ROUNDS`` rounds.
- When an order of the round ends otherwise (its scheduled end, its spend cap, the buyer ending it), the
  whole cluster ends.

``cluster_advance`` makes those decisions. It runs after every change of a node's state (the order
transition enqueues it) and from the minute sweep, under a lock on the cluster's row, and it is
idempotent: a round's node orders are unique per (cluster, round, node), so two coordinators can never
start a node twice.

A cluster that asks for a placement group (``Cluster.placement_group``) launches each round's nodes into
one cluster placement group of the round's provider account, named by ``placement_group_name`` (a round
may be another zone, and a cluster group is bound to one zone, so each round has its own). The groups
are deleted by ``cluster_placement_groups_release``, see its docstring.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.billing.credit import PaymentRequired, order_hold_place
from marketplace.catalog.selectors import offer_book
from marketplace.launch.config import LaunchChoice
from marketplace.matching import Demand, Exclusion, OfferView, rank
from marketplace.models import (
    Cluster,
    ClusterState,
    LaunchConfiguration,
    Offer,
    Order,
    OrderState,
    Organization,
    PaymentTerms,
    Quote,
)
from marketplace.orders.blocks import provider_blocks
from marketplace.orders.budgets import budget_check
from marketplace.orders.errors import IdempotencyConflict, OfferNotOrderable, OrderError, QuoteUsed, TransitionRefused
from marketplace.orders.services import (
    _offer_on_sale,
    _quoted_offer,
    launch_config_for,
    order_terminate,
)
from marketplace.taskkit import enqueue_on_commit
from marketplace.webhooks.services import order_event_emit
from providers.errors import ProviderError
from providers.services import adapter_for_account

log = logging.getLogger(__name__)

# Offers one cluster tries before it fails: each round launches every node, so a long chain of sold-out
# zones costs the buyer minutes of machines that could not all start.
MAX_ROUNDS = 5
_LIVE = (OrderState.PLACED, OrderState.PROVISIONING, OrderState.RUNNING)


class ClusterRefused(OrderError):
    code = "cluster_refused"


@dataclass(frozen=True)
class ClusterRequest:
    """``nodes`` instances of an offer at its current price, or a quote for several nodes at its locked price
    (the quote's demand says how many)."""

    offer_id: int | None = None
    quote_id: str | None = None
    nodes: int | None = None
    max_price_per_node_hour: Decimal | None = None
    allow_failover: bool = True
    regions: tuple[str, ...] = ()
    needs_rdma: bool = False
    placement_group: bool = False
    duration_hours: Decimal | None = None
    launch: LaunchChoice | None = None
    caller_address: str | None = None

    def fingerprint(self) -> str:
        body = {
            "offer": self.offer_id,
            "quote": self.quote_id,
            "nodes": self.nodes,
            "cap": None if self.max_price_per_node_hour is None else format(self.max_price_per_node_hour, "f"),
            "allow_failover": self.allow_failover,
            "regions": sorted(self.regions),
            "needs_rdma": self.needs_rdma,
            "duration_hours": None if self.duration_hours is None else format(self.duration_hours, "f"),
            "launch": None if self.launch is None else {"data": self.launch.data, "template": self.launch.template},
        }
        if self.placement_group:
            # Only when asked, so every fingerprint stored before the field existed still matches its request.
            body["placement_group"] = True
        message = json.dumps(body, sort_keys=True, default=str).encode()
        return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class ClusterPlaced:
    cluster: Cluster
    created: bool


def _ledger(cluster: Cluster, kind: str, **fields: Any) -> None:
    ledger_append(
        kind=kind,
        subject=f"cluster:{cluster.public_id}",
        payload={"cluster": str(cluster.public_id), "organization": cluster.organization_id, **fields},
    )


def _group_demand(cluster: Cluster, *, cap_per_node: Decimal | None) -> Demand:
    """The engine's demand for the whole group: the offer's GPU model and size, on ``nodes`` machines."""
    return Demand(
        gpu_count=cluster.gpu_count,
        nodes=cluster.nodes,
        gpu_models=frozenset({cluster.gpu_model.key}),
        regions=frozenset(cluster.regions),
        pricing_models=frozenset({cluster.pricing_model}),
        max_price_per_hour=None if cap_per_node is None else cap_per_node * cluster.nodes,
        needs_rdma=cluster.needs_rdma,
        placement_group=cluster.placement_group,
    )


def placement_group_name(cluster: Cluster, round_: int) -> str:
    """The cluster placement group of one round of ``cluster`` (unique per cluster and round)."""
    return f"gb-{cluster.public_id.hex}-r{round_}"


def _view(offer_id: int, now: dt.datetime) -> OfferView | None:
    """The offer as the ranking sees it (datasheet, RDMA, reliability, capacity), from the book on sale."""
    return next((v for v in offer_book(now=now).views if v.offer_id == offer_id), None)


def cluster_place(
    *,
    organization: Organization,
    user: AbstractBaseUser,
    request: ClusterRequest,
    idempotency_key: str | None = None,
    now: dt.datetime | None = None,
) -> ClusterPlaced:
    """Place a cluster: check that the offer serves every node (enough instances left, one instance type in
    one zone, RDMA and a placement group if asked, within the cap), then store it and its first round's node
    orders in one transaction and start provisioning them. Refusals (``OrderError`` subclasses,
    ``LaunchConfigInvalid``, ``BudgetExceeded``) write nothing. Idempotent on (organization,
    ``idempotency_key``) like orders."""
    fingerprint = request.fingerprint()
    if idempotency_key:
        existing = Cluster.objects.filter(organization=organization, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.request_fingerprint != fingerprint:
                raise IdempotencyConflict("this Idempotency-Key was already used with a different request body")
            return ClusterPlaced(cluster=existing, created=False)
    now = now or timezone.now()
    quote: Quote | None = None
    nodes = request.nodes
    if request.quote_id is not None:
        quote, offer, group_price = _quoted_offer(organization, request.quote_id, now)
        quoted_nodes = int((quote.demand or {}).get("nodes", 1))
        if nodes is not None and nodes != quoted_nodes:
            raise ClusterRefused(f"the quote is for {quoted_nodes} node(s), not {nodes}")
        nodes = quoted_nodes
        price = (group_price / nodes).quantize(Decimal("0.000001"))
        # A quote asked for a placement group holds the cluster to one, as its price was ranked with it.
        placement_group = request.placement_group or bool((quote.demand or {}).get("placement_group"))
    else:
        offer = _offer_on_sale(request.offer_id)
        price = offer.price_usd
        placement_group = request.placement_group
    if nodes is None or nodes < 2:
        raise ClusterRefused("a cluster has at least 2 nodes; order one machine as an order")
    cap = request.max_price_per_node_hour if request.max_price_per_node_hour is not None else price
    if price > cap:
        raise OfferNotOrderable(f"offer {offer.pk} costs {price} USD/h per node, above your cap of {cap}")
    draft = Cluster(
        nodes=nodes,
        gpu_model=offer.gpu_model,
        gpu_count=offer.gpu_count,
        pricing_model=offer.pricing_model,
        regions=list(request.regions),
        needs_rdma=request.needs_rdma,
        placement_group=placement_group,
    )
    view = _view(offer.pk, now)
    if view is None:
        raise OfferNotOrderable(f"offer {offer.pk} has no fresh price on sale now; ask for a new one")
    # The quote locked the price: only the group's fit is checked now, not the listing's current price.
    ranking = rank(_group_demand(draft, cap_per_node=None if quote else cap), [view], now=now)
    if ranking.best is None:
        why = "; ".join(m.relax for m in ranking.near_misses) or ", ".join(ranking.rejected)
        raise OfferNotOrderable(f"offer {offer.pk} cannot hold {nodes} nodes: {why}")
    try:
        with transaction.atomic():
            locked = Organization.objects.select_for_update().get(pk=organization.pk)
            budget_check(locked, adding_per_hour=price * nodes, now=now)
            config = launch_config_for(
                organization=organization,
                user=user,
                offer=offer,
                quote=quote,
                launch=request.launch,
                caller_address=request.caller_address,
            )
            cluster = Cluster.objects.create(
                organization=organization,
                created_by=user,
                offer=offer,
                quote=quote,
                nodes=nodes,
                gpu_model=offer.gpu_model,
                gpu_count=offer.gpu_count,
                pricing_model=offer.pricing_model,
                regions=list(request.regions),
                needs_rdma=request.needs_rdma,
                placement_group=placement_group,
                max_price_per_node_hour=cap,
                allow_failover=request.allow_failover,
                duration_hours=request.duration_hours,
                launch_config=config,
                state_changed_at=now,
                idempotency_key=idempotency_key or None,
                request_fingerprint=fingerprint,
            )
            _ledger(
                cluster,
                "cluster.placed",
                nodes=nodes,
                offer=offer.pk,
                instance_type=offer.instance_type,
                zone=offer.zone,
                price_usd_per_node_hour=price,
                max_price_per_node_hour=cap,
                quote=None if quote is None else str(quote.public_id),
                launch_sha256=config.sha256,
                placement_group=placement_group,
            )
            _round_start(cluster, offer, price, now)
    except IntegrityError:
        holder = None if quote is None else Cluster.objects.filter(quote=quote).first()
        if holder is not None and (not idempotency_key or holder.idempotency_key != idempotency_key):
            raise QuoteUsed(f"quote {quote.public_id} has already been ordered") from None  # type: ignore[union-attr]
        if not idempotency_key:
            raise
        existing = Cluster.objects.get(organization=organization, idempotency_key=idempotency_key)
        if existing.request_fingerprint != fingerprint:
            raise IdempotencyConflict("this Idempotency-Key was already used with a different request body") from None
        return ClusterPlaced(cluster=existing, created=False)
    return ClusterPlaced(cluster=cluster, created=True)


def _round_start(cluster: Cluster, offer: Offer, price: Decimal, now: dt.datetime) -> None:
    """Store the round's node orders on ``offer`` (placed, no failover of their own) and enqueue their
    provisioning after the commit. The caller holds the transaction (and, past round one, the cluster's lock)."""
    config: LaunchConfiguration = cluster.launch_config
    spend_cap = config.spec.get("spend_cap_usd")
    # The launch configuration's spend cap is the whole group's: each node may spend its share.
    node_cap = None if spend_cap is None else (Decimal(spend_cap) / cluster.nodes).quantize(Decimal("0.01"))
    # The organisation's row lock makes the nodes' holds and a concurrent order's one step.
    organization = Organization.objects.select_for_update().get(pk=cluster.organization_id)
    for node in range(1, cluster.nodes + 1):
        order = Order.objects.create(
            launch_config=config,
            spend_cap_usd=node_cap,
            organization_id=cluster.organization_id,
            created_by_id=cluster.created_by_id,
            offer=offer,
            gpu_model=cluster.gpu_model,
            gpu_count=cluster.gpu_count,
            pricing_model=cluster.pricing_model,
            regions=list(cluster.regions),
            max_price_per_hour=max(cluster.max_price_per_node_hour, price),
            allow_failover=False,
            price_per_hour=price,
            duration_hours=cluster.duration_hours,
            state=OrderState.PLACED,
            state_changed_at=now,
            cluster=cluster,
            cluster_round=cluster.round,
            cluster_node=node,
        )
        if organization.payment_terms == PaymentTerms.PREPAID:
            order_hold_place(order, organization, now=now)  # each node holds its own hour
        ledger_append(
            kind="order.placed",
            subject=f"order:{order.public_id}",
            payload={
                "order": str(order.public_id),
                "organization": order.organization_id,
                "state": OrderState.PLACED,
                "cluster": str(cluster.public_id),
                "round": cluster.round,
                "node": node,
                "offer": offer.pk,
                "instance_type": offer.instance_type,
                "zone": offer.zone,
                "price_usd_per_hour": price,
            },
        )
        order_event_emit(order=order, previous=None, now=now)
        enqueue_on_commit("marketplace.order_provision", order.pk)
    _ledger(cluster, "cluster.round_started", round=cluster.round, offer=offer.pk, zone=offer.zone, nodes=cluster.nodes)


def _transition(cluster: Cluster, to: str, reason: str, **fields: Any) -> None:
    if to not in Cluster.TRANSITIONS[cluster.state]:
        raise TransitionRefused(f"cluster {cluster.public_id} cannot go from {cluster.state} to {to}")
    now = timezone.now()
    Cluster.objects.filter(pk=cluster.pk).update(state=to, state_reason=reason, state_changed_at=now)
    _ledger(cluster, f"cluster.{to}", previous=cluster.state, state=to, reason=reason, round=cluster.round, **fields)
    cluster.state, cluster.state_reason, cluster.state_changed_at = to, reason, now


def _terminate_live(orders: list[Order], reason: str) -> None:
    for order in orders:
        if order.state in _LIVE:
            try:
                order_terminate(order=order, reason=reason)
            except TransitionRefused:
                pass  # it ended meanwhile: nothing of it is left to stop


def _next_offer(cluster: Cluster, now: dt.datetime) -> tuple[Offer, Decimal] | None:
    """The best offer for the whole group now, every offer an earlier round tried left out, and what other
    orders' recent failures block."""
    tried = set(cluster.orders.values_list("offer_id", flat=True))
    shared = provider_blocks(now=now)
    exclusion = Exclusion(
        offer_ids=frozenset(tried),
        zone_types=shared.zone_types,
        account_regions=shared.account_regions,
        accounts=shared.accounts,
    )
    ranking = rank(
        _group_demand(cluster, cap_per_node=cluster.max_price_per_node_hour),
        offer_book(now=now),
        now=now,
        max_age=dt.timedelta(seconds=settings.OFFER_MAX_AGE_S),
        exclusion=exclusion,
        limit=20,
    )
    for quote in ranking.quotes:
        # Same size and a whole card per GPU, as an order's own failover: never a slice, never a bigger machine.
        if quote.offer.gpu_count == cluster.gpu_count and quote.offer.gpu_fraction == 1:
            offer = Offer.objects.select_related("account", "gpu_model").get(pk=quote.offer.offer_id)
            return offer, offer.price_usd
    return None


def cluster_advance(*, cluster_id: int, now: dt.datetime | None = None) -> str:
    """Move the cluster on from what its current round's node orders are doing (module docstring), then
    delete the placement groups of its rounds that are over (``cluster_placement_groups_release``, after the
    lock is let go: it calls the provider). Returns what it did, for the log and the tests: "running",
    "waiting", "failed-over", "failed", "ending", "terminated" or "ended" (already final)."""
    outcome = _advance(cluster_id, now or timezone.now())
    cluster_placement_groups_release(cluster_id=cluster_id)
    return outcome


def _advance(cluster_id: int, now: dt.datetime) -> str:
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().select_related("gpu_model", "launch_config").get(pk=cluster_id)
        if cluster.state in Cluster.FINAL_STATES:
            return "ended"
        everyone = list(cluster.orders.order_by("cluster_round", "cluster_node"))
        if cluster.state == ClusterState.TERMINATING:
            _terminate_live(everyone, cluster.state_reason or "cluster terminated")
            if all(o.state in Order.FINAL_STATES for o in cluster.orders.all()):
                _transition(cluster, ClusterState.TERMINATED, cluster.state_reason)
                return "terminated"
            return "ending"
        members = [o for o in everyone if o.cluster_round == cluster.round]
        failed = [o for o in members if o.state == OrderState.FAILED]
        ended = [o for o in members if o.state not in _LIVE and o.state != OrderState.FAILED]
        if failed:
            return _round_failed(cluster, members, failed[0], now)
        if ended:
            first = ended[0]
            reason = f"node {first.cluster_node} ended: {first.state_reason or first.state}; the cluster ends with it"
            _transition(cluster, ClusterState.TERMINATING, reason)
            _terminate_live(everyone, reason)
            return "ending"
        if cluster.state == ClusterState.PROVISIONING and all(o.state == OrderState.RUNNING for o in members):
            _transition(
                cluster,
                ClusterState.RUNNING,
                f"all {cluster.nodes} nodes running",
                orders=[str(o.public_id) for o in members],
            )
            return "running"
        return "waiting"


def _round_failed(cluster: Cluster, members: list[Order], failed: Order, now: dt.datetime) -> str:
    """A node of the current round failed: stop the round's others and try the whole group again on the
    next offer, or fail the cluster when failover is off, the rounds are spent or no offer fits."""
    offer = failed.offer
    why = f"node {failed.cluster_node} on {offer.instance_type} in {offer.zone} failed: {failed.state_reason}"
    _terminate_live(members, f"cluster round {cluster.round} failed ({why})")
    _ledger(cluster, "cluster.round_failed", round=cluster.round, offer=offer.pk, reason=why)
    following = None
    if cluster.allow_failover and cluster.round < MAX_ROUNDS:
        following = _next_offer(cluster, now)
    if following is None:
        if not cluster.allow_failover:
            tail = "failover was not allowed, so no other offer was tried"
        elif cluster.round >= MAX_ROUNDS:
            tail = f"{MAX_ROUNDS} offers tried"
        else:
            tail = "no other offer holds every node within the cap"
        _transition(cluster, ClusterState.FAILED, f"{why}; {tail}")
        return "failed"
    offer, price = following
    if cluster.state == ClusterState.RUNNING:
        _transition(cluster, ClusterState.PROVISIONING, f"{why}; the whole group is provisioned again")
    try:
        with transaction.atomic():
            cluster.round += 1
            cluster.offer = offer
            Cluster.objects.filter(pk=cluster.pk).update(round=cluster.round, offer=offer, state_reason=why)
            _round_start(cluster, offer, price, now)
    except PaymentRequired as exc:
        cluster.round -= 1
        _transition(cluster, ClusterState.FAILED, f"{why}; the next offer was not tried: {exc}")
        return "failed"
    return "failed-over"


def cluster_terminate(*, cluster: Cluster, reason: str = "terminated by buyer") -> Cluster:
    """End the cluster: every node order of every round is terminated; the cluster is terminated once they
    all are. Idempotent: a cluster already ending or ended is returned as it is."""
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if locked.state in Cluster.FINAL_STATES or locked.state == ClusterState.TERMINATING:
            return locked
        _transition(locked, ClusterState.TERMINATING, reason)
        _terminate_live(list(locked.orders.all()), reason)
    enqueue_on_commit("marketplace.cluster_advance", locked.pk)
    return locked


def cluster_placement_groups_release(*, cluster_id: int) -> list[str]:
    """Delete the placement groups of the cluster's rounds that are over, oldest first; returns the names
    deleted now.

    A round is over once a later round started or the cluster ended, and its group can go once every node
    order of the round is final: before that its machines may still be stopping, and AWS refuses to delete
    a group that holds an instance not yet terminated (``InvalidPlacementGroup.InUse``). Each node's last
    transition enqueues ``cluster_advance``, which calls this, so the group goes as soon as it can; a delete
    the provider still refuses, or cannot be asked, is left for the next call, and the minute sweep calls
    again for every cluster with a group left (``clusters_to_advance``). Rounds are released in order and
    counted in ``Cluster.placement_groups_released`` with a conditional update, so a racing call deletes
    nothing twice (and a group already gone counts as deleted). Best effort: never raises a provider error."""
    cluster = Cluster.objects.get(pk=cluster_id)
    if not cluster.placement_group:
        return []
    last_over = cluster.round if cluster.state in Cluster.FINAL_STATES else cluster.round - 1
    deleted: list[str] = []
    for round_ in range(cluster.placement_groups_released + 1, last_over + 1):
        members = list(cluster.orders.filter(cluster_round=round_).select_related("offer__account"))
        if any(o.state not in Order.FINAL_STATES for o in members):
            break
        name = placement_group_name(cluster, round_)
        if members:
            offer = members[0].offer
            try:
                adapter_for_account(offer.account).delete_placement_group(offer.region, name)
            except ProviderError as exc:
                log.info("cluster %s: placement group %s not deleted yet: %s", cluster.public_id, name, exc)
                break
        with transaction.atomic():
            claimed = Cluster.objects.filter(pk=cluster.pk, placement_groups_released=round_ - 1).update(
                placement_groups_released=round_
            )
            if claimed != 1:
                break  # another call released it meanwhile
            _ledger(cluster, "cluster.placement_group_deleted", round=round_, placement_group=name)
        deleted.append(name)
    return deleted


def clusters_to_advance() -> list[int]:
    """Clusters for the minute sweep: those not ended yet (a coordinator task lost with a worker is made up
    here), and those whose rounds' placement groups are not all deleted yet."""
    groups_left = Q(placement_group=True, placement_groups_released__lt=F("round"))
    return list(
        Cluster.objects.filter(~Q(state__in=Cluster.FINAL_STATES) | groups_left)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
