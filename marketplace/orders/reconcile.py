"""The reconciler: the broker's view of an order against each provider's, drift fixed.

Every instance the broker launches is tagged with its order's reference, so the providers can be asked
what exists for an order. For each order it looks at the accounts the order's attempts went to and:

- adopts an instance launched for a pending attempt whose outcome was never recorded (the worker died
  between the provider's answer and the commit): the launch is recorded as if the answer had arrived;
- terminates an instance of an order in a final state (an orphan: it bills for nothing the buyer has);
- terminates an instance the order does not run on (a second machine, or one from an attempt already
  settled), so an order never has more than its one instance.

Per account (``account_resources_reconcile``), it also lists what else the broker created for orders (key
pairs, security groups, firewall rules, all tagged with the order) and releases what belongs to orders that
ended, or to orders the broker does not know: nothing a launch creates outlives its order.

Every action is ledgered. Safe to run at any time and any number of times.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections import defaultdict

from celery.exceptions import SoftTimeLimitExceeded
from django.db import transaction
from django.utils import timezone

from ledger.services import ledger_append
from marketplace.models import Attempt, AttemptOutcome, Instance, Order, OrderState, WebhookEventType
from marketplace.orders.launching import record_launch
from marketplace.webhooks.services import instance_event_emit
from providers.base import ProviderAdapter
from providers.errors import ProviderError
from providers.launch import OrderResource
from providers.models import ProviderAccount
from providers.services import adapter_for_account
from providers.types import InstanceHandle, InstanceState

log = logging.getLogger(__name__)

# Ending already: nothing to terminate. A STOPPED instance is not gone (its disk is kept, and billed, until it is
# terminated): it is the order's own machine (one the broker stopped) or an orphan to terminate like any other.
_GONE = (InstanceState.TERMINATED, InstanceState.STOPPING)


@dataclasses.dataclass
class ReconcileReport:
    adopted: list[str] = dataclasses.field(default_factory=list)
    terminated: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)


def _ledger(order: Order, kind: str, **fields: object) -> None:
    ledger_append(kind=kind, subject=f"order:{order.public_id}", payload={"order": str(order.public_id), **fields})


def _pending_attempt_for(order: Order, account: ProviderAccount, handle: InstanceHandle) -> Attempt | None:
    """The pending attempt that launched ``handle``: same account and region; its number is in the tags."""
    pending = order.attempts.select_related("offer__account").filter(
        outcome=AttemptOutcome.PENDING, offer__account=account, offer__region=handle.region
    )
    number = handle.tags.get("broker:attempt")
    for attempt in pending:
        if number is None or str(attempt.number) == number:
            return attempt
    return None


def order_reconcile(*, order_id: int) -> ReconcileReport:
    """Bring the provider side of one order in line with the broker's record (see the module docstring).
    Each account the order tried is reconciled on its own: one that cannot be built, asked or acted on
    (whatever it raises) is reported in ``errors`` and the others are still reconciled."""
    report = ReconcileReport()
    order = Order.objects.get(pk=order_id)
    accounts = {a.offer.account_id: a.offer.account for a in order.attempts.select_related("offer__account")}
    for account in accounts.values():
        try:
            _order_reconcile_account(order, account, report)
        except ProviderError as exc:
            report.errors.append(f"{account.kind}/{account.name}: {exc}")
        except SoftTimeLimitExceeded:
            raise  # the sweep's time is up: not this account's failure
        except Exception:  # one account's surprise must not leave the order's other accounts unreconciled
            log.exception("reconciling order %s on account %s failed", order.public_id, account.pk)
            report.errors.append(f"{account.kind}/{account.name}: unexpected error (logged)")
    return report


def _order_reconcile_account(order: Order, account: ProviderAccount, report: ReconcileReport) -> None:
    adapter = adapter_for_account(account)
    for handle in adapter.find_by_order(order.ref):
        if handle.state in _GONE:
            continue
        order.refresh_from_db()
        known = Instance.objects.filter(
            order=order, account=account, region=handle.region, provider_instance_id=handle.instance_id
        ).first()
        live = order.state not in Order.FINAL_STATES
        if known is not None and known.active and live:
            continue  # the order's own machine
        # A stopped machine is not adopted: nobody's boot will make it ready; the order launches afresh.
        if known is None and order.state == OrderState.PROVISIONING and handle.state != InstanceState.STOPPED:
            attempt = _pending_attempt_for(order, account, handle)
            if attempt is not None and not Instance.objects.filter(order=order, active=True).exists():
                record_launch(order, attempt, handle, adopted=True)
                report.adopted.append(handle.instance_id)
                continue
        why = f"order is {order.state}" if not live else "not the order's instance"
        try:
            stopped = adapter.terminate(handle.region, handle.instance_id)
        except ProviderError as exc:
            report.errors.append(f"{handle.instance_id}: {exc}")
            continue
        with transaction.atomic():
            if known is not None:
                Instance.objects.filter(pk=known.pk).update(
                    active=False, state=stopped.state.value, terminated_at=known.terminated_at or timezone.now()
                )
                if known.active:  # the buyer's webhooks have not yet heard that it stopped
                    instance_event_emit(
                        instance_id=known.pk, event_type=WebhookEventType.INSTANCE_TERMINATED, reason=why
                    )
            _ledger(
                order,
                "order.orphan_terminated",
                instance=handle.instance_id,
                account=account.pk,
                region=handle.region,
                reason=why,
            )
        report.terminated.append(handle.instance_id)


def orders_to_reconcile(*, now: dt.datetime, quiet_s: int = 300, lookback_s: int = 86400) -> list[int]:
    """Orders worth a look: not final and untouched for ``quiet_s`` (a worker may have died on them), and
    final ones that ended within ``lookback_s`` (a machine may have outlived them)."""
    quiet = now - dt.timedelta(seconds=quiet_s)
    recent = now - dt.timedelta(seconds=lookback_s)
    stuck = Order.objects.exclude(state__in=Order.FINAL_STATES).filter(state_changed_at__lt=quiet)
    ended = Order.objects.filter(state__in=Order.FINAL_STATES, state_changed_at__gte=recent)
    return sorted(set(stuck.values_list("pk", flat=True)) | set(ended.values_list("pk", flat=True)))


def _order_for_ref(ref: str) -> Order | None:
    public_id = Order.public_id_of(ref)
    return None if public_id is None else Order.objects.filter(public_id=public_id).first()


def account_resources_reconcile(*, account_id: int, now: dt.datetime, grace_s: int = 120) -> ReconcileReport:
    """Release the resources (besides instances) the account holds for orders that ended at least ``grace_s``
    ago or that the broker does not know (see the module docstring). A resource the provider will not delete
    yet (still attached to a machine shutting down) is reported as an error and tried again next time, and so
    is an order whose release fails in any other way (logged with its reference): the account's other
    orders are still released."""
    report = ReconcileReport()
    account = ProviderAccount.objects.get(pk=account_id)
    try:
        adapter = adapter_for_account(account)
        resources = adapter.list_order_resources()
    except ProviderError as exc:
        report.errors.append(f"{account.kind}/{account.name}: {exc}")
        return report
    by_order: dict[str, list[OrderResource]] = defaultdict(list)
    for resource in resources:
        by_order[resource.order_ref].append(resource)
    for ref, held in sorted(by_order.items()):
        try:
            _order_resources_release(account, adapter, ref, held, now=now, grace_s=grace_s, report=report)
        except ProviderError as exc:
            report.errors.append(f"{ref}: {exc}")
        except SoftTimeLimitExceeded:
            raise  # the sweep's time is up: not this order's failure
        except Exception:  # one order's surprise must not keep the account's other orders' resources held
            log.exception("releasing the resources of order %s on account %s failed", ref, account.pk)
            report.errors.append(f"{ref}: unexpected error (logged)")
    return report


def _order_resources_release(
    account: ProviderAccount,
    adapter: ProviderAdapter,
    ref: str,
    held: list[OrderResource],
    *,
    now: dt.datetime,
    grace_s: int,
    report: ReconcileReport,
) -> None:
    order = _order_for_ref(ref)
    if order is not None and (
        order.state not in Order.FINAL_STATES or order.state_changed_at > now - dt.timedelta(seconds=grace_s)
    ):
        return
    remaining = adapter.release_order_resources(ref)
    left = {(r.kind, r.resource_id) for r in remaining}
    released = [r for r in held if (r.kind, r.resource_id) not in left]
    report.errors.extend(f"{ref}: {r.kind} {r.resource_id} still in use" for r in remaining)
    report.terminated.extend(f"{r.kind}:{r.resource_id}" for r in released)
    if not released:
        return
    items = [f"{r.kind}:{r.region}:{r.resource_id}" for r in released]
    if order is None:
        log.warning("released %s of unknown order %s on account %s", items, ref, account.pk)
        return
    why = f"order is {order.state}"
    # ``ledger_append`` runs only inside a transaction; the sweep itself runs in autocommit.
    with transaction.atomic():
        _ledger(order, "order.resources_released", account=account.pk, resources=items, reason=why)
