"""API views: parse, check ownership, call one service, render."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import F, QuerySet
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ledger.checkpoints import consistency_proof
from ledger.keys import verifier_key
from ledger.models import Checkpoint, LedgerEntry
from ledger.receipts import (
    PENDING,
    PENDING_RETRY_AFTER_S,
    checkpoint_json,
    key_history_json,
    latest_checkpoint,
    receipt_for_buyer,
)
from marketplace.api import idempotency, pagination
from marketplace.api.launch import client_address
from marketplace.api.outputs import (
    CheckpointOutput,
    CheckpointPageOutput,
    ConsistencyOutput,
    LeafHashesOutput,
    LedgerKeyOutput,
    ProcurementOutput,
    ReceiptOutput,
)
from marketplace.api.schema import ERROR
from marketplace.api.serializers import (
    BudgetInput,
    BudgetOutput,
    InvoiceOutput,
    OfferListInput,
    OfferOutput,
    OfferPageOutput,
    OfferPricesOutput,
    OrderOutput,
    OrderPageOutput,
    OrderPlacedOutput,
    OrderPlaceInput,
    ProcurementInput,
    QuoteBatchOutput,
    QuoteCreateInput,
    QuoteOutput,
    demand_from,
)
from marketplace.api.throttling import ExpensiveRateThrottle, TokenRateThrottle
from marketplace.api.tokens import request_organization
from marketplace.billing.credit import CURRENCY
from marketplace.catalog.history import offer_prices
from marketplace.catalog.query import MAX_QUERY, QueryError, gpu_partitions, offers_query, rows_in_order
from marketplace.catalog.selectors import OfferFilters, offers_filter
from marketplace.launch.config import LaunchChoice
from marketplace.matching import Ranking
from marketplace.models import Offer, Order, Organization
from marketplace.money import lines_total, minor_text, minor_units
from marketplace.orders.budgets import budget_set, budget_status
from marketplace.orders.quoting import demand_json, procurement_run, quote_request
from marketplace.orders.selectors import (
    BuyerPermission,
    invoice_line_list,
    month_bounds,
    order_get,
    order_ledger_heads,
    order_list,
)
from marketplace.orders.services import PlaceRequest, order_place, order_terminate

# What month_bounds reads: strptime's %Y-%m, four digits of year (from 0001) and a month 01 to 12; empty: this
# month, as when it is absent.
MONTH_PATTERN = r"^$|^([0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})-(0[1-9]|1[0-2])$"
SEARCH_PARAMS = [
    OpenApiParameter(
        "q",
        {"type": "string", "maxLength": MAX_QUERY},
        description="the query language, e.g. gpu=H100 count>=8 region=eu price<40",
    ),
    OpenApiParameter("sort", str, enum=["price", "gpuprice", "tflops", "score"]),
]


# The whole-number query parameters: (default, minimum, maximum), read by _count and stated in the schema.
PRICE_DAYS = (30, 1, 365)
CHECKPOINTS_AFTER = (0, 0, 2**63 - 1)
CHECKPOINTS_LIMIT = (100, 1, 1000)
TREE_SIZE = (0, 1, 2**63 - 1)
LEAVES_START = (1, 1, 2**63 - 1)
LEAVES_LIMIT = (10_000, 1, 10_000)


def count_parameter(name: str, default: int, minimum: int, maximum: int, *, required: bool = False) -> OpenApiParameter:
    """The schema of a whole-number query parameter ``_count`` reads, with its bounds."""
    schema = {"type": "integer", "minimum": minimum, "maximum": maximum, **({} if required else {"default": default})}
    return OpenApiParameter(name, schema, required=required, description=f"{minimum} to {maximum}")


def _count(request: Request, name: str, default: int, minimum: int, maximum: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    # Length first: int() of a 5,000-digit text raises (a 500), and a long one costs time for nothing.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 19) or not minimum <= int(raw) <= maximum:
        raise ValidationError({name: [f"a whole number from {minimum} to {maximum}"]})
    return int(raw)


def _order_output(order: Order) -> dict[str, object]:
    return dict(OrderOutput(order, context={"ledger_heads": order_ledger_heads([order])}).data)


class OfferListApi(APIView):
    """GET /api/v1/offers: offers for sale now, a page at a time (cursor pagination). ``q`` searches in the
    query language (marketplace/catalog/query.py) and ``sort`` is price, gpuprice, tflops or score; the older
    filter parameters (gpu, count, region, pricing, max_price) still work."""

    required_scopes = {"GET": ("offers:read",)}

    @extend_schema(
        parameters=[OfferListInput, *SEARCH_PARAMS, *pagination.PARAMETERS],
        responses={200: OfferPageOutput, 400: ERROR},
    )
    def get(self, request: Request) -> Response:
        search, sort = request.query_params.get("q", ""), request.query_params.get("sort", "price")
        params = OfferListInput(data=request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        now = timezone.now()
        try:
            offers = offers_query(search, now=now, sort=sort)
        except QueryError as exc:
            raise ValidationError({"sort" if exc.term == sort and not search else "q": [str(exc)]}) from None
        offers = offers_filter(
            offers,
            OfferFilters(
                gpu_model=data.get("gpu", ""),
                min_gpu_count=data.get("count"),
                region=data.get("region", ""),
                pricing_model=data.get("pricing", ""),
                max_price_per_hour=data.get("max_price"),
            ),
        )
        offers = offers_for_output(offers)
        keys = [pagination.Key("sort_key", parse=OFFER_SORT_PARSE[sort]), pagination.Key("id")]
        tag = pagination.listing_tag("offers", search, sort, sorted(data.items()))
        partitions = gpu_partitions(search, sort)
        page = pagination.paginate(
            request, offers, keys=keys, tag=tag, fetch=lambda qs, n: rows_in_order(qs, partitions, n)
        )
        return Response(page.body(request, OfferOutput(page.rows, many=True).data))


def _offer_or_404(offer_id: str) -> Offer:
    known = offer_id.isascii() and offer_id.isdigit() and len(offer_id) <= 18  # within a bigint
    offer = offers_for_output(Offer.objects.filter(pk=int(offer_id))).first() if known else None
    if offer is None:
        raise NotFound("no such offer")
    return offer


class OfferDetailApi(APIView):
    """GET /api/v1/offers/<id>: one offer, whether on sale now or not (``status`` says)."""

    required_scopes = {"GET": ("offers:read",)}

    @extend_schema(operation_id="offer_retrieve", responses={200: OfferOutput, 404: ERROR})
    def get(self, request: Request, offer_id: str) -> Response:
        return Response(OfferOutput(_offer_or_404(offer_id)).data)


class OfferPricesApi(APIView):
    """GET /api/v1/offers/<id>/prices?days=30: the offer's prices over the last ``days`` (1-365), each with
    when it took effect; the first is the one in force when the window opened, the last the current one."""

    required_scopes = {"GET": ("offers:read",)}

    @extend_schema(
        operation_id="offer_prices",
        parameters=[count_parameter("days", *PRICE_DAYS)],
        responses={200: OfferPricesOutput, 400: ERROR, 404: ERROR},
    )
    def get(self, request: Request, offer_id: str) -> Response:
        days = _count(request, "days", *PRICE_DAYS)
        offer = _offer_or_404(offer_id)
        since = timezone.now() - dt.timedelta(days=days)
        prices = offer_prices(offer, since=since)
        return Response(
            {
                "offer": offer.pk,
                "since": since,
                "prices": [{"from": moment, "price_usd": str(price)} for moment, price in prices],
            }
        )


# What OfferOutput writes, and no more: the account row carries credentials and the offer its raw extras.
OFFER_COLUMNS = [
    *(f for f in OfferOutput.Meta.fields if f not in ("provider", "gpu_model", "price_per_gpu_hour_usd", "sla")),
    "price_per_gpu_usd", "usd_per_tflop_hour", "sla_availability", "sla_credits", "sla_source",
]  # fmt: skip


def offers_for_output(offers: QuerySet[Offer]) -> QuerySet[Offer]:
    """``offers`` reading only what OfferOutput writes, the account's kind and the model's key as columns:
    a page of a hundred offers then builds a hundred model instances, not three hundred."""
    return (
        offers.select_related(None)
        .annotate(provider_kind=F("account__kind"), gpu_model_key=F("gpu_model__key"))
        .only(*OFFER_COLUMNS)
    )


OFFER_SORT_PARSE = {
    "price": pagination.decimal_key, "gpuprice": pagination.float_key, "tflops": pagination.float_key,
    "score": pagination.float_key,
}  # fmt: skip


class OrderListCreateApi(APIView):
    """GET lists the caller's orders; POST places one (``Idempotency-Key`` makes a retry return the same order)."""

    required_scopes = {"GET": ("orders:place", "instances:manage"), "POST": ("orders:place",)}

    @extend_schema(operation_id="orders_list", parameters=pagination.PARAMETERS, responses={200: OrderPageOutput})
    def get(self, request: Request) -> Response:
        organization = request_organization(request)
        orders = order_list(organization=organization).order_by("-id")
        page = pagination.paginate(
            request, orders, keys=[pagination.Key("id", descending=True)], tag=pagination.listing_tag("orders")
        )
        heads = order_ledger_heads(page.rows)
        return Response(page.body(request, OrderOutput(page.rows, many=True, context={"ledger_heads": heads}).data))

    @extend_schema(
        request=OrderPlaceInput,
        parameters=[idempotency.PARAMETER],
        responses={
            200: OrderPlacedOutput,
            201: OrderPlacedOutput,
            400: ERROR,
            402: ERROR,
            404: ERROR,
            409: ERROR,
            410: ERROR,
        },
    )
    def post(self, request: Request) -> Response:
        organization = request_organization(request, BuyerPermission.ORDER)
        key = idempotency.idempotency_key(request)
        body = OrderPlaceInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        result = order_place(
            organization=organization,
            user=request.user,
            request=PlaceRequest(
                offer_id=data.get("offer"),
                quote_id=None if data.get("quote") is None else str(data["quote"]),
                max_price_per_hour=data.get("max_price_per_hour"),
                allow_failover=data["allow_failover"],
                bid_per_gpu_hour=data.get("bid_per_gpu_hour"),
                regions=tuple(data["regions"]),
                duration_hours=data.get("duration_hours"),
                launch=launch_choice(request, data),
                caller_address=client_address(request),
            ),
            idempotency_key=key,
        )
        body = {**_order_output(result.order), "warnings": list(result.warnings)}
        response = Response(body, status=status.HTTP_201_CREATED if result.created else 200)
        if not result.created:
            response["Idempotent-Replayed"] = "true"
        return response


def launch_choice(request: Request, data: dict[str, Any]) -> LaunchChoice | None:
    """The launch configuration a request names (inline or a template); None when it names none."""
    if "launch" not in data and "launch_template" not in data:
        return None
    return LaunchChoice(
        data=data.get("launch"), template=data.get("launch_template"), caller_address=client_address(request)
    )


def _order_or_404(request: Request, order_id: str, permission: BuyerPermission = BuyerPermission.READ) -> Order:
    order = order_get(organization=request_organization(request, permission), public_id=order_id)
    if order is None:
        raise NotFound("no such order")
    return order


class OrderDetailApi(APIView):
    required_scopes = {"GET": ("orders:place", "instances:manage")}

    @extend_schema(responses={200: OrderOutput, 404: ERROR})
    def get(self, request: Request, order_id: str) -> Response:
        return Response(_order_output(_order_or_404(request, order_id)))


class OrderTerminateApi(APIView):
    """POST /api/v1/orders/<id>/terminate: idempotent; 202 while the provider stops the instance."""

    required_scopes = {"POST": ("instances:manage",)}

    @extend_schema(request=None, responses={202: OrderOutput, 404: ERROR, 409: ERROR})
    def post(self, request: Request, order_id: str) -> Response:
        order = order_terminate(order=_order_or_404(request, order_id, BuyerPermission.ORDER))
        order = _order_or_404(request, str(order.public_id))
        return Response(_order_output(order), status=status.HTTP_202_ACCEPTED)


def _ranking_extras(ranking: Ranking) -> dict[str, object]:
    """What a buyer needs when the quotes are few or none: the defaults applied and the nearest misses."""
    return {
        "defaults": demand_json(ranking.demand),  # already the requirements the ranking applied
        "rejected": ranking.rejected,
        "near_misses": [
            {
                "offer": m.offer.offer_id,
                "instance_type": m.offer.instance_type,
                "region": m.offer.region,
                "gpu_model": m.offer.gpu_model,
                "price_per_hour": format(m.offer.price_usd_per_hour, "f"),
                "failed": list(m.failed),
                "relax": m.relax,
            }
            for m in ranking.near_misses
        ],
    }


class QuoteCreateApi(APIView):
    """POST /api/v1/quotes: one workload -> ranked quotes, prices locked until ``expires_at``."""

    # Quoting locks prices and ranks the whole book: a buyer's act, not a reader's, and throttled tighter.
    required_scopes = {"POST": ("orders:place",)}
    throttle_classes = [TokenRateThrottle, ExpensiveRateThrottle]

    @extend_schema(
        request=QuoteCreateInput,
        parameters=[idempotency.PARAMETER],
        responses={201: QuoteBatchOutput, 400: ERROR, 409: ERROR},
    )
    @idempotency.idempotent("quotes.create")
    def post(self, request: Request) -> Response:
        organization = request_organization(request, BuyerPermission.ORDER)
        body = QuoteCreateInput(data=request.data)
        body.is_valid(raise_exception=True)
        result = quote_request(
            organization=organization,
            user=request.user,
            demand=demand_from(body.validated_data),
            limit=body.validated_data["limit"],
            launch=launch_choice(request, body.validated_data),
        )
        return Response(
            {
                "batch": str(result.batch),
                "expires_at": result.expires_at,
                "quotes": QuoteOutput(result.quotes, many=True).data,
                **_ranking_extras(result.ranking),
            },
            status=status.HTTP_201_CREATED,
        )


class ProcurementCreateApi(APIView):
    """POST /api/v1/procurements: many workloads assigned jointly against finite capacity."""

    # Quoting locks prices and ranks the whole book: a buyer's act, not a reader's, and throttled tighter.
    required_scopes = {"POST": ("orders:place",)}
    throttle_classes = [TokenRateThrottle, ExpensiveRateThrottle]

    @extend_schema(
        request=ProcurementInput,
        parameters=[idempotency.PARAMETER],
        responses={201: ProcurementOutput, 400: ERROR, 409: ERROR},
    )
    @idempotency.idempotent("procurements.create")
    def post(self, request: Request) -> Response:
        organization = request_organization(request, BuyerPermission.ORDER)
        body = ProcurementInput(data=request.data)
        body.is_valid(raise_exception=True)
        demands = [demand_from(d) for d in body.validated_data["demands"]]
        launches = {
            i: choice
            for i, d in enumerate(body.validated_data["demands"])
            if (choice := launch_choice(request, d)) is not None
        }
        result = procurement_run(
            organization=organization,
            user=request.user,
            demands=demands,
            time_limit=body.validated_data.get("time_limit"),
            launches=launches,
        )
        a = result.assignment
        return Response(
            {
                "batch": str(result.batch),
                "expires_at": result.expires_at,
                "total_cost": format(a.total_cost, "f"),
                "objective": a.objective,
                "lower_bound": a.lower_bound,
                "gap": a.gap,
                "method": a.method,
                "optimal": a.optimal,
                "seconds": a.seconds,
                "placed": sum(1 for d in a.demands if d.quote is not None),
                "assignments": [
                    {
                        "demand": d.demand.demand_id or str(i + 1),
                        "quote": None if i not in result.quotes else QuoteOutput(result.quotes[i]).data,
                        "reason": d.reason,
                    }
                    for i, d in enumerate(a.demands)
                ],
            },
            status=status.HTTP_201_CREATED,
        )


def _budget_body(organization: Organization) -> dict[str, object]:
    state = budget_status(organization, now=timezone.now())

    def money(value: Decimal | None) -> str | None:
        return None if value is None else format(value, "f")

    return {
        "budget_per_hour": money(state.budget_per_hour),
        "budget_monthly": money(state.budget_monthly),
        "live_per_hour": money(state.live_per_hour),
        "month_to_date": money(state.month_to_date),
    }


class BudgetApi(APIView):
    """GET /api/v1/budget: the organisation's budgets and where it stands; PUT sets them (owners only)."""

    required_scopes = {"GET": ("orders:place",)}  # changing budgets needs an owner's session, never a token

    @extend_schema(responses={200: BudgetOutput})
    def get(self, request: Request) -> Response:
        return Response(_budget_body(request_organization(request)))

    @extend_schema(request=BudgetInput, responses={200: BudgetOutput, 400: ERROR, 403: ERROR})
    def put(self, request: Request) -> Response:
        organization = request_organization(request, BuyerPermission.BUDGETS)
        body = BudgetInput(data=request.data)
        body.is_valid(raise_exception=True)
        budget_set(
            organization,
            per_hour=body.validated_data["budget_per_hour"],
            monthly=body.validated_data["budget_monthly"],
            by=request.user,
        )
        return Response(_budget_body(organization))


class InvoiceApi(APIView):
    """GET /api/v1/invoice?month=YYYY-MM: the lines of the orders that ended that month (UTC) and their total.

    Each line's amount is rounded once to the cent, as the book charges it (``marketplace.money``), and the total
    is the sum of those lines: ``amount_minor``/``total_minor`` in cents, ``amount_usd``/``total_usd`` the same
    figures as decimal text."""

    required_scopes = {"GET": ("orders:place", "instances:manage")}

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "month",
                {"type": "string", "pattern": MONTH_PATTERN},
                description="YYYY-MM (UTC); absent or empty: this month",
            )
        ],
        responses={200: InvoiceOutput, 400: ERROR},
    )
    def get(self, request: Request) -> Response:
        organization = request_organization(request)
        raw = request.query_params.get("month") or timezone.now().strftime("%Y-%m")
        try:
            start, end = month_bounds(raw)
        except ValueError:
            raise ValidationError({"month": ["give the month as YYYY-MM"]}) from None
        lines = list(invoice_line_list(organization=organization, start=start, end=end))
        amounts = [minor_units(line.amount_usd, CURRENCY) for line in lines]
        rows = [
            {
                "order": str(line.order.public_id),
                "description": line.description,
                "seconds": line.seconds,
                "price_per_hour": format(line.price_per_hour, "f"),
                "amount_minor": amount,
                "amount_usd": minor_text(amount, CURRENCY),
                "ended_at": line.ended_at.isoformat(),
            }
            for line, amount in zip(lines, amounts, strict=True)
        ]
        total = lines_total(amounts)
        return Response(
            {
                "month": raw,
                "currency": CURRENCY,
                "lines": rows,
                "total_minor": total,
                "total_usd": minor_text(total, CURRENCY),
            }
        )


class OrderReceiptApi(APIView):
    """GET /api/v1/orders/<id>/receipt: the order's ledger entries, each with its inclusion proof against the
    newest checkpoint, that checkpoint's signed note and anchor, and the verifier key (ledger/receipts.py).

    Entries newer than every checkpoint make the receipt ``"status": "pending"`` (with ``first_pending`` and
    ``signed_size``) and the answer carries ``Retry-After``: a checkpoint covering them is being signed. Still
    200: what is covered is proven as usual, and pending is not an error."""

    required_scopes = {"GET": ("ledger:read",)}

    @extend_schema(
        responses={200: ReceiptOutput, 404: ERROR},
        parameters=[
            OpenApiParameter(
                "Retry-After",
                int,
                OpenApiParameter.HEADER,
                response=[200],
                description="seconds before asking again, when the receipt is pending",
            )
        ],
    )
    def get(self, request: Request, order_id: str) -> Response:
        order = _order_or_404(request, order_id)
        body = receipt_for_buyer(f"order:{order.public_id}")
        if body["status"] == PENDING:
            return Response(body, headers={"Retry-After": str(PENDING_RETRY_AFTER_S)})
        return Response(body)


class LedgerKeyApi(APIView):
    """GET /api/v1/ledger/key: the key checkpoints are signed with, and every earlier one with the checkpoints it
    signed and its handover (ledger/receipts.py). Public, like everything an auditor needs."""

    permission_classes = [AllowAny]

    @extend_schema(responses={200: LedgerKeyOutput})
    def get(self, request: Request) -> Response:
        return Response(
            {"origin": settings.LEDGER_ORIGIN, "verifier_key": verifier_key(), "key_history": key_history_json()}
        )


class CheckpointListApi(APIView):
    """GET /api/v1/ledger/checkpoints?after=<size>&limit=<n>: signed checkpoints in size order, with anchors."""

    permission_classes = [AllowAny]

    @extend_schema(
        parameters=[count_parameter("after", *CHECKPOINTS_AFTER), count_parameter("limit", *CHECKPOINTS_LIMIT)],
        responses={200: CheckpointPageOutput, 400: ERROR},
    )
    def get(self, request: Request) -> Response:
        after = _count(request, "after", *CHECKPOINTS_AFTER)
        limit = _count(request, "limit", *CHECKPOINTS_LIMIT)
        page = list(Checkpoint.objects.select_related("anchor").filter(size__gt=after).order_by("size")[: limit + 1])
        more = len(page) > limit
        page = page[:limit]
        return Response(
            {
                "checkpoints": [checkpoint_json(c) for c in page],
                "next_after": page[-1].size if more and page else None,
            }
        )


class CheckpointLatestApi(APIView):
    """GET /api/v1/ledger/checkpoints/latest: the newest signed checkpoint."""

    permission_classes = [AllowAny]

    @extend_schema(responses={200: CheckpointOutput, 404: ERROR})
    def get(self, request: Request) -> Response:
        checkpoint = latest_checkpoint()
        if checkpoint is None:
            raise NotFound("no checkpoint has been signed yet")
        return Response(checkpoint_json(checkpoint))


class ConsistencyApi(APIView):
    """GET /api/v1/ledger/consistency?old=<size>&new=<size>: proof that the larger tree extends the smaller."""

    permission_classes = [AllowAny]

    @extend_schema(
        parameters=[
            count_parameter("old", *TREE_SIZE, required=True),
            count_parameter("new", *TREE_SIZE, required=True),
        ],
        responses={200: ConsistencyOutput, 400: ERROR},
    )
    def get(self, request: Request) -> Response:
        missing = [name for name in ("old", "new") if name not in request.query_params]
        if missing:
            raise ValidationError({name: ["required"] for name in missing})
        old = _count(request, "old", *TREE_SIZE)
        new = _count(request, "new", *TREE_SIZE)
        return Response({"old_size": old, "new_size": new, "proof": consistency_proof(old, new)})


class LeafHashesApi(APIView):
    """GET /api/v1/ledger/leaves?start=<sequence>&limit=<n>: leaf hashes in order, enough to recompute every
    checkpoint's root; they reveal nothing of the entries."""

    permission_classes = [AllowAny]

    @extend_schema(
        parameters=[count_parameter("start", *LEAVES_START), count_parameter("limit", *LEAVES_LIMIT)],
        responses={200: LeafHashesOutput, 400: ERROR},
    )
    def get(self, request: Request) -> Response:
        start = _count(request, "start", *LEAVES_START)
        limit = _count(request, "limit", *LEAVES_LIMIT)
        rows = LedgerEntry.objects.filter(sequence__gte=start).order_by("sequence")[:limit]
        return Response({"start": start, "leaf_hashes": list(rows.values_list("leaf_hash", flat=True))})
