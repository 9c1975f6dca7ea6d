"""Storefront pages: offers with filters, an order button and a comparison; my orders with state, instance and
ledger hash, and one order's page with its telemetry; the organisation's spending and budgets."""

from __future__ import annotations

import csv
import datetime as dt
import secrets
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from ledger.receipts import receipt_for_buyer
from marketplace.api.idempotency import idempotency_claim
from marketplace.api.serializers import demand_from
from marketplace.api.tokens import api_token_create, api_token_revoke
from marketplace.billing.credit import CURRENCY
from marketplace.catalog.history import price_history, spot_savings
from marketplace.catalog.selectors import offer_facts
from marketplace.launch.config import on_silence_of
from marketplace.launch.selectors import order_boot, order_connection
from marketplace.models import ApiToken, LeaseState, Offer, Order, OrderState, Organization, Quote
from marketplace.money import lines_total, minor_text, minor_units
from marketplace.orders.actions import order_actions
from marketplace.orders.bids import offer_bidding, offers_winning_bids
from marketplace.orders.budgets import budget_set, budget_status
from marketplace.orders.errors import OrderError
from marketplace.orders.quoting import quote_request
from marketplace.orders.selectors import (
    BuyerPermission,
    buyer_role_allows,
    invoice_line_list,
    live_order_costs,
    month_bounds,
    order_failed_attempts,
    order_get,
    order_history,
    order_ledger_heads,
    order_list,
    order_telemetry,
    order_usage,
    order_workload_log,
)
from marketplace.orders.services import order_terminate
from marketplace.orders.silence import order_silence
from marketplace.sla.selectors import order_sla
from marketplace.web.charts import price_chart, telemetry_chart
from marketplace.web.compare import CompareError, compare_ids, comparison
from marketplace.web.forms import ApiTokenForm, BudgetForm, WorkloadForm
from marketplace.web.launchview import launch_shown
from marketplace.web.orgs import buyer_access
from marketplace.web.search import (
    MORE_FILTERS,
    PERF_METRIC,
    PERF_UNIT,
    SORT_LABELS,
    display_form,
    more_filters_open,
    relaxations,
    search_request,
    search_run,
    search_url,
)
from marketplace.web.search import PAGE_SIZE as OFFERS_PAGE_SIZE

PAGE_SIZE = 200


def _org_or_404(request: HttpRequest, permission: BuyerPermission = BuyerPermission.READ) -> Organization:
    """The active buyer organisation (marketplace/web/orgs.py), once the role there may do ``permission``."""
    return buyer_access(request, permission).organization


def offers(request: HttpRequest) -> HttpResponse:
    """Offers for sale, one row per account, instance type, region and pricing model, found by one search in the
    query language (marketplace/catalog/query.py) that the box and the filter controls both edit
    (marketplace/web/search.py); ``?q=&sort=&page=`` is the address of a result page."""
    asked = search_request(request.GET)
    if asked.redirect is not None:
        return redirect(reverse("storefront:offers") + asked.redirect)
    now = timezone.now()
    result = search_run(asked.q, sort=asked.sort, page=asked.page, now=now)
    leads = [group.lead for group in result.rows.groups] if result.rows else []
    form = asked.form or display_form(result.terms)
    empty = result.rows is not None and not result.rows.offer_total
    context = {
        "form": form, "more_filters": MORE_FILTERS, "more_open": more_filters_open(form), "q": asked.q,
        "sort": asked.sort,
        "query_error": result.error, "rows": result.rows, "offers": leads, "page": result.page,
        "pages": result.pages, "page_size": OFFERS_PAGE_SIZE, "savings": spot_savings(leads),
        "bids": offers_winning_bids(leads), "facts": offer_facts(leads, metric=PERF_METRIC, now=now),
        "perf_unit": PERF_UNIT,
        "relaxations": relaxations(result.terms, now=now, sort=asked.sort) if empty and result.terms else [],
        "previous_url": search_url(asked.q, asked.sort, result.page - 1) if result.page > 1 else "",
        "next_url": search_url(asked.q, asked.sort, result.page + 1) if result.page < result.pages else "",
        "sorts": SORT_LABELS, "first_row": (result.page - 1) * OFFERS_PAGE_SIZE + 1,
        "last_row": (result.page - 1) * OFFERS_PAGE_SIZE + len(leads),
    }  # fmt: skip
    return render(request, "storefront/offers.html", context)


DAYS = {"1": 1, "7": 7, "30": 30, "90": 90}


def prices(request: HttpRequest, offer_id: int) -> HttpResponse:
    """Price history of an offer's instance type in its region: on-demand and spot per zone, over 1-90 days."""
    offer = Offer.objects.select_related("account", "gpu_model").filter(pk=offer_id).first()
    if offer is None:
        raise Http404("no such offer")
    days = DAYS.get(request.GET.get("days", "30"), 30)
    until = timezone.now()
    since = until - dt.timedelta(days=days)
    series = price_history(
        account_id=offer.account_id, instance_type=offer.instance_type, region=offer.region, since=since
    )
    seen = [moment for s in series for moment, _ in s.points]
    if seen and min(seen) > since:
        # A young listing: draw from its first recorded price, not from an empty month.
        since = min(seen) - max((until - min(seen)) / 20, dt.timedelta(minutes=1))
    drawing = price_chart(series, instance_type=offer.instance_type, since=since, until=until)
    now_prices = {(s.pricing_model, s.zone): s.points[-1][1] for s in series if s.points}
    on_demand = [p for (model, _), p in now_prices.items() if model == "on_demand"]
    spot = [p for (model, _), p in now_prices.items() if model == "spot"]
    saving = int((1 - min(spot) / min(on_demand)) * 100) if spot and on_demand and min(on_demand) > 0 else None
    return render(
        request,
        "storefront/prices.html",
        {"offer": offer, "chart": drawing, "series": [s for s in series if s.points], "days": days,
         "since": since, "until": until, "saving": saving, "points": sum(len(s.points) for s in series),
         "bidding": offer_bidding(offer)},
    )  # fmt: skip


@login_required
@require_http_methods(["GET", "POST"])
def workload(request: HttpRequest) -> HttpResponse:
    """The workload form; a valid submission ranks the offers and shows the quotes with their reasons.

    Submitting stores quotes with locked prices, so it is a POST (CSRF-checked, not replayed by a reload,
    a prefetch or a shared link); a GET only shows the form, to a viewer too (without its button)."""
    org = _org_or_404(request, BuyerPermission.ORDER if request.method == "POST" else BuyerPermission.READ)
    form = WorkloadForm(request.POST if request.method == "POST" else None)
    context: dict[str, object] = {"form": form, "result": None, "requirements": None}
    if form.is_bound and form.is_valid():
        result = quote_request(organization=org, user=request.user, demand=demand_from(form.demand_data()))  # type: ignore[arg-type]
        # The requirements the ranking applied (the profile's defaults resolved against the GPU specs).
        requirements = result.ranking.demand
        context.update(
            result=result,
            rows=quote_rows(result.quotes),
            requirements=requirements,
            # A set prints in hash order, different on every run; the page lists the models sorted.
            allowed_models=sorted(requirements.gpu_models),
        )
    return render(request, "storefront/workload.html", context)


@dataclass(frozen=True)
class QuoteRow:
    """One line of the workload page: a quote, and the quotes for the same instance type, region, pricing and
    job cost in other zones of the same account (the same choice in another zone, each orderable)."""

    quote: Quote
    zones: tuple[Quote, ...]


def quote_rows(quotes: list[Quote]) -> list[QuoteRow]:
    """``quotes`` (best first) with each one that only repeats an earlier quote in another zone folded into its
    row, so ten quotes are not six copies of one offer."""
    rows: list[QuoteRow] = []
    index: dict[tuple[object, ...], int] = {}
    for quote in quotes:
        offer = quote.offer
        key = (offer.account_id, offer.instance_type, offer.region, offer.pricing_model, quote.price_per_hour,
               round(Decimal(str(quote.breakdown.get("job_cost", quote.score))), 2))  # fmt: skip
        if key in index:
            row = rows[index[key]]
            rows[index[key]] = QuoteRow(quote=row.quote, zones=(*row.zones, quote))
        else:
            index[key] = len(rows)
            rows.append(QuoteRow(quote=quote, zones=()))
    return rows


@login_required
def orders(request: HttpRequest) -> HttpResponse:
    org = _org_or_404(request)
    rows = list(order_list(organization=org)[:PAGE_SIZE])
    heads = order_ledger_heads(rows)
    now = timezone.now()
    return render(
        request,
        "storefront/orders.html",
        {"orders": [(o, heads.get(o.pk, ""), order_usage(o, now=now)) for o in rows], "organization": org},
    )


@login_required
def order_receipt(request: HttpRequest, order_id: str) -> HttpResponse:
    """The order's ledger receipt: entries, inclusion proofs, the signed checkpoint and its anchor. The page
    checks the proofs and the signature itself (static/receipt.js), not trusting the server's word."""
    order = order_get(organization=_org_or_404(request), public_id=order_id)
    if order is None:
        raise Http404("no such order")
    return render(
        request, "storefront/receipt.html", {"order": order, "receipt": receipt_for_buyer(f"order:{order.public_id}")}
    )


@login_required
@require_POST
def order_terminate_view(request: HttpRequest, order_id: str) -> HttpResponse:
    org = _org_or_404(request, BuyerPermission.ORDER)
    order = order_get(organization=org, public_id=order_id)
    if order is None:
        raise Http404("no such order")
    try:
        order_terminate(order=order)
    except OrderError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Order {order.public_id} is being terminated.")
    back = request.POST.get("next", "")
    if back and url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        return redirect(back)
    return redirect("storefront:orders")


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    """The organisation's API tokens: create one with scopes (shown once), see them, revoke them. Viewers
    only see them."""
    org = _org_or_404(request, BuyerPermission.TOKENS if request.method == "POST" else BuyerPermission.READ)
    form = ApiTokenForm(request.POST or None)
    issued = None
    if request.method == "POST" and form.is_valid():
        try:
            with transaction.atomic():
                if not idempotency_claim(org, "web.tokens.create", request.POST.get("nonce", "")):
                    messages.info(request, "That token was already created; it was shown then.")
                    return redirect("storefront:tokens")
                issued = api_token_create(
                    organization=org, user=request.user, name=form.cleaned_data["name"],
                    scopes=form.cleaned_data["scopes"],
                )  # fmt: skip
        except ValueError as exc:  # scopes beyond the role's, or a name that is not readable text
            field, _, message = str(exc).partition(": ")
            form.add_error(field if field in form.fields else None, message)
        else:
            form = ApiTokenForm()
    response = render(
        request,
        "storefront/tokens.html",
        {
            "organization": org,
            "form": form,
            "issued": issued,
            "tokens": ApiToken.objects.filter(organization=org),
            "nonce": secrets.token_urlsafe(16),  # a resubmitted form (a reload, a double click) creates one
        },
    )
    if issued is not None:
        response.headers["Cache-Control"] = "no-store"  # the token must not linger in a cache
    return response


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = ApiToken.objects.filter(pk=token_id, organization=_org_or_404(request, BuyerPermission.TOKENS)).first()
    if token is None:
        raise Http404("no such token")
    api_token_revoke(token=token)
    messages.success(request, f"Token {token.name} ({token.prefix}…) revoked.")
    return redirect("storefront:tokens")


# --- Comparing offers ------------------------------------------------------------------------------------------


def compare(request: HttpRequest) -> HttpResponse:
    """2 to 6 chosen offers side by side (``?ids=1,2,3``), the best of each numeric row highlighted. Public
    like the offers page: it shows only the catalogue."""
    try:
        columns, rows = comparison(compare_ids(request.GET.getlist("ids")), now=timezone.now())
    except CompareError as exc:
        response = render(request, "storefront/compare.html", {"error": str(exc), "columns": [], "rows": []})
        response.status_code = 400
        return response
    return render(
        request,
        "storefront/compare.html",
        {"columns": columns, "rows": rows, "error": "", "offers_left": sum(not c.on_sale for c in columns)},
    )


# --- Spending --------------------------------------------------------------------------------------------------


def _month(request: HttpRequest, now: dt.datetime) -> tuple[str, dt.datetime, dt.datetime, str]:
    """The month asked for (``?month=YYYY-MM``, this month by default) and its bounds; a bad or future month
    falls back to this one with the reason as the fourth value."""
    current = now.astimezone(dt.UTC).strftime("%Y-%m")
    raw = request.GET.get("month", "").strip() or current
    try:
        start, end = month_bounds(raw)
    except ValueError:
        start, end = month_bounds(current)
        return current, start, end, f"“{raw[:20]}” is not a month: give it as YYYY-MM, e.g. {current}."
    if start > now:
        start, end = month_bounds(current)
        return current, start, end, f"{raw} has not started yet; showing {current}."
    return raw, start, end, ""


@login_required
@require_http_methods(["GET", "POST"])
def spending(request: HttpRequest) -> HttpResponse:
    """The organisation's budgets and where it stands, a month's invoice lines and total, and what its live
    orders have run up in that month. Owners set the budgets here; everyone else sees them."""
    membership = buyer_access(request, BuyerPermission.BUDGETS if request.method == "POST" else BuyerPermission.READ)
    org = membership.organization
    is_owner = buyer_role_allows(membership.role, BuyerPermission.BUDGETS)
    now = timezone.now()
    month, start, end, month_error = _month(request, now)
    if request.method == "POST":
        form = BudgetForm(request.POST)
        if form.is_valid():
            budget_set(
                org,
                per_hour=form.cleaned_data["budget_per_hour"],
                monthly=form.cleaned_data["budget_monthly"],
                by=request.user,  # type: ignore[arg-type]
            )
            messages.success(request, "Budgets saved.")
            return redirect(f"{reverse('storefront:spending')}?month={month}")
    else:
        form = BudgetForm(initial={"budget_per_hour": org.budget_per_hour, "budget_monthly": org.budget_monthly})
    lines = list(invoice_line_list(organization=org, start=start, end=end))
    live = live_order_costs(organization=org, start=start, end=end, now=now)
    lines_minor = [minor_units(line.amount_usd, CURRENCY) for line in lines]
    live_minor = [minor_units(usage.amount_usd, CURRENCY) for _, usage in live]
    status = budget_status(org, now=now)
    warn_share = Decimal(str(settings.BUDGET_WARN_SHARE))
    response = render(
        request,
        "storefront/spending.html",
        {
            "organization": org,
            "is_owner": is_owner,
            "form": form,
            "status": status,
            "warn_share": warn_share,
            "warn_per_hour": None if status.budget_per_hour is None else status.budget_per_hour * warn_share,
            "warn_monthly": None if status.budget_monthly is None else status.budget_monthly * warn_share,
            "month": month,
            "month_start": start,
            "month_error": month_error,
            "previous_month": (start - dt.timedelta(days=1)).strftime("%Y-%m"),
            "next_month": end.strftime("%Y-%m") if end <= now else "",
            # Each amount rounded once (marketplace.money); a total is the sum of the rounded lines shown.
            "lines": [
                (line, Decimal(line.seconds) / 3600, line_minor)
                for line, line_minor in zip(lines, lines_minor, strict=True)
            ],
            "lines_total": lines_total(lines_minor),
            "live": [(order, usage, usage_minor) for (order, usage), usage_minor in zip(live, live_minor, strict=True)],
            "live_total": lines_total(live_minor),
        },
    )
    if month_error or (request.method == "POST"):
        response.status_code = 400  # a bad month, or a budget form sent back with its errors
    return response


@login_required
def spending_csv(request: HttpRequest) -> HttpResponse:
    """The month's invoice lines as CSV, for a spreadsheet or an accounting import."""
    org = _org_or_404(request)
    month, start, end, month_error = _month(request, timezone.now())
    if month_error:
        return HttpResponseBadRequest(month_error, content_type="text/plain; charset=utf-8")
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="spending-{month}.csv"'
    writer = csv.writer(response)
    writer.writerow(["order", "description", "ended_at", "seconds", "price_per_hour_usd", "amount_usd"])
    for line in invoice_line_list(organization=org, start=start, end=end):
        writer.writerow(
            [line.order.public_id, line.description, line.ended_at.isoformat(), line.seconds,
             format(line.price_per_hour, "f"), minor_text(minor_units(line.amount_usd, CURRENCY), CURRENCY)]
        )  # fmt: skip
    return response


# --- One order -------------------------------------------------------------------------------------------------

TELEMETRY_WINDOW = dt.timedelta(hours=1)


# Where the agent on the machine stopped, as the order page says it (providers/community/lease.py's stages).
FAILURE_STAGES = {
    "gpus": "while checking the GPUs",
    "workload": "while starting the workload",
    "ssh": "while waiting for SSH to answer",
}


@dataclass(frozen=True)
class BootStep:
    label: str
    at: dt.datetime | None
    detail: str
    status: str  # done | current | failed | pending


def _boot_steps(order: Order, boot: dict[str, Any] | None) -> list[BootStep]:
    """The current machine's way to ready: launched, running at the provider, agent started, ready."""
    instance = order.instance
    if instance is None or boot is None:
        return []
    attempt = next((a for a in order.attempts.all() if a.pk == instance.attempt_id), None)
    number = attempt.number if attempt else ""
    broken = boot["failure"] is not None or boot["state"] in (LeaseState.FAILED, LeaseState.REFUSED)
    stages = [
        ("Machine launched", instance.launched_at, f"attempt {number} · {instance.instance_type} in {instance.zone}"),
        ("Provider reports it running", instance.running_at, "the machine is up; its agent is starting"),
        ("Broker's agent started", boot["claimed_at"], "it claimed the machine's one-time boot token"),
        ("Ready", boot["ready_at"], "GPUs checked, workload started, SSH answering"),
    ]
    steps, open_seen = [], False
    for label, at, detail in stages:
        if at is not None:
            status = "done"
        elif not open_seen:
            # Where it stopped: a failure, the step it waits on, or (terminated first) simply not reached.
            if broken or order.state == OrderState.FAILED:
                status = "failed"
            else:
                status = "pending" if order.state in Order.FINAL_STATES else "current"
            open_seen = True
        else:
            status = "pending"
        steps.append(BootStep(label=label, at=at, detail=detail, status=status))
    return steps


# The order page's logs panel: the workload's last lines, as its agent last sent them.
LOG_LINES_SHOWN = 50


@login_required
def order_detail(request: HttpRequest, order_id: str) -> HttpResponse:
    """One order: its state and ledger history, how its machine boots and how to connect once it is ready,
    what it runs, price and cost so far, and the last hour of GPU telemetry from the agent on the machine.
    static/storefront/order.js keeps state and cost current from the orders API and redraws the machine,
    telemetry and history parts from this page."""
    order = order_get(organization=_org_or_404(request), public_id=order_id)
    if order is None:
        raise Http404("no such order")
    now = timezone.now()
    telemetry = order_telemetry(order, since=now - TELEMETRY_WINDOW, now=now)
    charts = {}
    if telemetry is not None and telemetry.minutes:
        minutes, since = telemetry.minutes, now - TELEMETRY_WINDOW
        charts["utilization"] = telemetry_chart(
            [(m, u) for m, u, _, _ in minutes], title="GPU utilization, mean of the GPUs", unit="%",
            label="Utilization (%)", since=since, until=now,
        )  # fmt: skip
        charts["temperature"] = telemetry_chart(
            [(m, t) for m, _, t, _ in minutes], title="Temperature of the hottest GPU", unit="°C",
            label="Temperature (°C)", since=since, until=now,
        )  # fmt: skip
        rated = (float(telemetry.tdp_w), f"rated {telemetry.tdp_w} W") if telemetry.tdp_w else None
        charts["power"] = telemetry_chart(
            [(m, p) for m, _, _, p in minutes], title="Power draw, all GPUs", unit="W", label="Power (W)",
            since=since, until=now, top=rated[0] if rated else 100, reference=rated,
        )  # fmt: skip
    boot = order_boot(order)
    instance = order.instance
    return render(
        request,
        "storefront/order_detail.html",
        {
            "order": order,
            "usage": order_usage(order, now=now),
            "silence": order_silence(order, now=now),
            "sla": order_sla(order, now=now),
            "on_silence": on_silence_of(order.launch_config.spec if order.launch_config_id else None),
            "history": order_history(order),
            "instances": sorted(order.instances.all(), key=lambda i: i.pk, reverse=True),
            "instance": instance,
            "telemetry": telemetry,
            "charts": charts,
            "boot": boot,
            "boot_steps": _boot_steps(order, boot),
            "gpus_seen": [f"{n}\u00d7 {name}" for name, n in Counter(boot["gpus"] if boot else []).items()],
            "failure_stage": FAILURE_STAGES.get(boot["failure"]["stage"], "while booting")
            if boot and boot["failure"]
            else "",
            "waiting": boot is not None
            and boot["state"] in (LeaseState.WAITING, LeaseState.CLAIMED)
            and order.state == OrderState.PROVISIONING,
            "connection": order_connection(order),
            "failed_attempts": order_failed_attempts(order),
            "launch": launch_shown(order.launch_config.spec if order.launch_config else None),
            "heartbeat_s": settings.LEASE_HEARTBEAT_S,
            "live": order.state not in Order.FINAL_STATES,
            "terminable": order.state
            in (
                OrderState.PLACED,
                OrderState.PROVISIONING,
                OrderState.RUNNING,
                OrderState.STOPPING,
                OrderState.STOPPED,
                OrderState.STARTING,
            ),
            "actions": order_actions(order),
            "workload_log": order_workload_log(order, lines=LOG_LINES_SHOWN),
            "now": now,
        },
    )
