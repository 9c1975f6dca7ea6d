"""Organisation budgets: an hourly cap on the rate of live orders and a monthly cap on usage.

Placing an order checks both under a lock on the organisation's row, so two concurrent orders cannot
each see room the other takes. A refused order raises ``BudgetExceeded``; one that takes either figure past
``BUDGET_WARN_SHARE`` of its cap is placed with a warning.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Sum

from ledger.services import ledger_append, user_commitment
from marketplace.models import Instance, Order, OrderState, Organization
from marketplace.money import from_minor, lines_total, minor_units
from marketplace.orders.errors import OrderError

LIVE_STATES = (
    OrderState.PLACED,
    OrderState.PROVISIONING,
    OrderState.RUNNING,
    OrderState.STOPPING,
    OrderState.STOPPED,
    OrderState.STARTING,
    OrderState.TERMINATING,
)
_CENTS = Decimal("0.01")
_USD = "USD"  # orders are priced in US dollars


class BudgetExceeded(OrderError):
    code = "budget_exceeded"


@dataclass(frozen=True)
class BudgetStatus:
    live_per_hour: Decimal  # what the organisation's live orders cost per hour together
    month_to_date: Decimal  # usage since the first of the month (UTC), at each order's locked price
    budget_per_hour: Decimal | None
    budget_monthly: Decimal | None


def _month_start(now: dt.datetime) -> dt.datetime:
    return now.astimezone(dt.UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def budget_status(organization: Organization, *, now: dt.datetime) -> BudgetStatus:
    """Both figures beside both budgets, whether set or not (what the spending page shows)."""
    return BudgetStatus(
        live_per_hour=_live_per_hour(organization),
        month_to_date=_month_to_date(organization, now=now),
        budget_per_hour=organization.budget_per_hour,
        budget_monthly=organization.budget_monthly,
    )


def _live_per_hour(organization: Organization) -> Decimal:
    live = Order.objects.filter(organization=organization, state__in=LIVE_STATES)
    return live.aggregate(total=Sum("price_per_hour"))["total"] or Decimal(0)


def _month_to_date(organization: Organization, *, now: dt.datetime) -> Decimal:
    start = _month_start(now)
    by_order: dict[int, Decimal] = defaultdict(Decimal)
    instances = Instance.objects.filter(order__organization=organization, ready_at__isnull=False).exclude(
        terminated_at__lt=start
    )
    for instance in instances.select_related("order").only("ready_at", "terminated_at", "order__price_per_hour"):
        begin = max(instance.ready_at, start)
        end = instance.terminated_at or now
        seconds = max(0.0, (end - begin).total_seconds())
        by_order[instance.order_id] += instance.order.price_per_hour * Decimal(int(seconds)) / 3600
    # Each order's usage rounded once, then summed (marketplace.money), as its invoice line will be charged.
    return from_minor(lines_total(minor_units(amount, _USD) for amount in by_order.values()), _USD)


def budget_check(organization: Organization, *, adding_per_hour: Decimal, now: dt.datetime) -> list[str]:
    """Refuse (``BudgetExceeded``) an order of ``adding_per_hour`` that the budgets do not allow; return
    the warnings for one they allow. The caller holds a lock on the organisation's row."""
    # Only the figures a budget is set for are read: an organisation without budgets places without reading
    # its orders (the month's usage walks every instance it ran this month).
    warn_share = Decimal(str(settings.BUDGET_WARN_SHARE))
    warnings: list[str] = []
    per_hour, monthly = organization.budget_per_hour, organization.budget_monthly
    if per_hour is not None:
        live_per_hour = _live_per_hour(organization)
        after = live_per_hour + adding_per_hour
        if after > per_hour:
            raise BudgetExceeded(
                f"this order would take your live orders to ${after:.2f}/h, above the hourly budget of "
                f"${per_hour}/h (now ${live_per_hour:.2f}/h)"
            )
        if after >= per_hour * warn_share:
            warnings.append(f"live orders at ${after:.2f}/h of the ${per_hour}/h hourly budget")
    if monthly is not None:
        month_to_date = _month_to_date(organization, now=now)
        if month_to_date >= monthly:
            raise BudgetExceeded(
                f"this month's usage ${month_to_date} has reached the monthly budget of "
                f"${monthly}; no new orders until it is raised or the month ends"
            )
        if month_to_date >= monthly * warn_share:
            warnings.append(f"this month's usage is ${month_to_date} of the ${monthly} budget")
    return warnings


def budget_set(
    organization: Organization, *, per_hour: Decimal | None, monthly: Decimal | None, by: AbstractBaseUser
) -> Organization:
    """Set (or clear, with None) the organisation's budgets, in cents; ledgered, so a change is on the record
    (who changed it as a commitment: erasable personal data stays out of the ledger)."""
    per_hour = None if per_hour is None else per_hour.quantize(_CENTS)
    monthly = None if monthly is None else monthly.quantize(_CENTS)
    with transaction.atomic():
        Organization.objects.filter(pk=organization.pk).update(budget_per_hour=per_hour, budget_monthly=monthly)
        ledger_append(
            kind="organization.budget",
            subject=f"organization:{organization.pk}",
            payload={
                "organization": organization.pk,
                "per_hour": per_hour,
                "monthly": monthly,
                "by": user_commitment(by),
            },
        )
    organization.budget_per_hour, organization.budget_monthly = per_hour, monthly
    return organization


def budget_room_per_hour(order: Order, *, now: dt.datetime) -> Decimal | None:
    """What ``order`` may cost per hour within its organisation's hourly budget, its own current rate set
    aside (for failing over to a dearer offer); None without an hourly budget."""
    organization = Organization.objects.get(pk=order.organization_id)
    if organization.budget_per_hour is None:
        return None
    others = _live_per_hour(organization)
    if order.state in LIVE_STATES:
        others -= order.price_per_hour
    return max(Decimal(0), organization.budget_per_hour - others)
