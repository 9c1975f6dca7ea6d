"""The offer comparison: which offers a buyer chose (``?ids=1,2,3``) and the table that sets them side by side.

Reads only what the offers page already shows to anyone (the catalogue, reliability scores and spot savings),
so the page needs no login and shows nothing of any organisation.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal

from marketplace.catalog.history import spot_savings
from marketplace.catalog.regions import jurisdiction_of
from marketplace.catalog.selectors import account_reliability, machine_reliability_shown, offer_list
from marketplace.models import Offer
from marketplace.money import rate_text

MIN_OFFERS, MAX_OFFERS = 2, 6
_ID = re.compile(r"[0-9]{1,12}")


def _usd(places: int) -> Callable[[object], str]:
    """A price column's figure: the rate with ``places`` decimals and its currency once (marketplace.money)."""
    return lambda value: rate_text(Decimal(str(value)), "USD", places=places)


class CompareError(ValueError):
    """The chosen ids cannot be compared; the message says why, for the buyer."""


def compare_ids(values: Iterable[str]) -> list[int]:
    """Offer ids from ``?ids=1,2,3`` or the offers page's repeated ``?ids=1&ids=2`` checkboxes, in the order
    given, each once. Raises ``CompareError`` for a non-number or fewer than 2 or more than 6 offers."""
    tokens = [token.strip() for value in values for token in value.split(",") if token.strip()]
    bad = [token for token in tokens if not _ID.fullmatch(token)]
    if bad:
        shown = ", ".join(repr(token[:20]) for token in bad[:3])
        raise CompareError(f"offer ids are whole numbers; {shown} is not one")
    ids = list(dict.fromkeys(int(token) for token in tokens))
    if len(ids) < MIN_OFFERS:
        raise CompareError(f"choose at least {MIN_OFFERS} offers to compare ({len(ids)} chosen)")
    if len(ids) > MAX_OFFERS:
        raise CompareError(f"compare at most {MAX_OFFERS} offers at a time ({len(ids)} chosen)")
    return ids


@dataclass(frozen=True)
class Column:
    """One offer of the comparison; ``on_sale`` is False for one no longer listed, stale or disabled."""

    offer: Offer
    on_sale: bool


@dataclass
class Cell:
    text: str
    note: str = ""
    best: bool = False


@dataclass
class Row:
    label: str
    cells: list[Cell] = field(default_factory=list)
    hint: str = ""  # what "best" means in this row, for the highlighted cells' title


def comparison(ids: list[int], *, now: dt.datetime) -> tuple[list[Column], list[Row]]:
    """The offers ``ids`` as columns and the comparison's rows, the best value of each numeric row marked
    among the offers still for sale. Raises ``CompareError`` naming ids that are no offer at all."""
    found = {o.pk: o for o in Offer.objects.filter(pk__in=ids).select_related("gpu_model", "account")}
    unknown = [str(i) for i in ids if i not in found]
    if unknown:
        raise CompareError(f"no offer with id {', '.join(unknown)}")
    on_sale = set(offer_list(now=now).filter(pk__in=ids).values_list("pk", flat=True))
    columns = [Column(offer=found[i], on_sale=i in on_sale) for i in ids]
    offers = [c.offer for c in columns]
    accounts = account_reliability(now=now)
    machines = machine_reliability_shown(now=now)
    savings = spot_savings(offers)

    def reliability(o: Offer) -> float | None:
        # An independent machine is judged on its own record (none before its first launch), a cloud offer on
        # its account's launches.
        return machines.get((o.account_id, o.zone), accounts.get(o.account_id))

    def per_tflop(o: Offer) -> Decimal | None:
        tflops = o.gpu_model.fp16_dense_tflops * o.gpu_count
        return o.price_usd / tflops if tflops else None

    rows = [
        _text("Provider", offers, lambda o: o.account.get_kind_display()),
        _text("Region", offers, lambda o: o.region, note=lambda o: o.zone),
        _text("Jurisdiction", offers, lambda o: jurisdiction_of(o.account.kind, o.region) or "unknown"),
        _text("Instance type", offers, lambda o: o.instance_type),
        _text("Pricing", offers, lambda o: o.get_pricing_model_display()),
        _text("GPU model", offers, lambda o: o.gpu_model.key,
              note=lambda o: f"{o.gpu_model.name} · {o.gpu_model.fp16_dense_tflops} FP16 TFLOPS"),
        _numeric("GPUs", columns, lambda o: o.gpu_count, str, higher=True),
        _numeric("Memory per GPU", columns, lambda o: o.gpu_memory_gb, lambda v: f"{v} GB", higher=True),
        _text("Interconnect", offers, lambda o: f"{o.gpu_model.interconnect} · {o.gpu_model.interconnect_gbs} GB/s",
              note=lambda o: o.interconnect and f"network: {o.interconnect}"),
        _numeric("vCPUs", columns, lambda o: o.vcpus, str, higher=True),
        _numeric("RAM", columns, lambda o: o.memory_gib, lambda v: f"{v.normalize():f} GiB", higher=True),
        _numeric("Price per hour", columns, lambda o: o.price_usd, _usd(4),
                 note=lambda o: "" if o.currency == "USD" else f"{o.price:.2f} {o.currency}"),
        _numeric("Price per GPU-hour", columns, lambda o: o.price_per_gpu_hour_usd, _usd(4)),
        _numeric("Price per FP16 TFLOP-hour", columns, per_tflop, _usd(5)),
        _numeric("Reliability", columns, reliability, lambda v: f"{v:.1%}", higher=True, missing="no launches yet"),
        _numeric("Spot saving", columns, lambda o: savings.get(o.pk), lambda v: f"{v} % vs on-demand", higher=True),
    ]  # fmt: skip
    return columns, rows


def _text(
    label: str, offers: list[Offer], value: Callable[[Offer], str], *, note: Callable[[Offer], str] | None = None
) -> Row:
    return Row(label, [Cell(value(o), note(o) if note else "") for o in offers])


def _numeric(
    label: str,
    columns: list[Column],
    value: Callable[[Offer], object],
    show: Callable[..., str],
    *,
    higher: bool = False,
    missing: str = "—",
    note: Callable[[Offer], str] | None = None,
) -> Row:
    values = [value(c.offer) for c in columns]
    cells = [
        Cell(missing if v is None else show(v), note(c.offer) if note else "")
        for c, v in zip(columns, values, strict=True)
    ]
    # Only offers one can still order compete; a row where they all agree has no best.
    candidates = [v for c, v in zip(columns, values, strict=True) if c.on_sale and v is not None]
    if len(set(candidates)) > 1:
        best = max(candidates) if higher else min(candidates)  # type: ignore[type-var]
        for c, v, cell in zip(columns, values, cells, strict=True):
            cell.best = c.on_sale and v == best
    return Row(label, cells, hint="most" if higher else "cheapest")
