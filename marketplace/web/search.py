"""The offers page's one search: the query box and the filter controls are two views of one query in the
language of ``marketplace.catalog.query``.

A control expresses exactly one kind of term (``CONTROLS``); a query fills the controls whose terms it holds in
that form, and a control whose field the query uses in another form (``count=8``, ``price<40``,
``gpu=H100,A100``) is shown held by the box, not blanked, so it never claims "any" for a narrowed field. The form
carries the query it was drawn from (``prev``): on submit, a control whose value differs from what that query
implied was changed by the buyer and rewrites its term in the box's text; the box's own edits stand as typed. The
result is redirected to ``?q=...&sort=...``, the one address of a search, which is also what the old public
links (``?gpu=T4&pricing=on_demand``) become.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.http import QueryDict

from marketplace.catalog.query import SORTS, QueryError, Term, offers_query, parse
from marketplace.catalog.selectors import OfferGroupPage, offer_groups
from marketplace.matching.profiles import GENERIC
from marketplace.web.forms import OfferFilterForm

PAGE_SIZE = 50
SORT_LABELS = {
    "price": "price per hour", "gpuprice": "price per GPU-hour", "tflops": "price per TFLOP-hour",
    "score": "score (per TFLOP-hour, by reliability)",
}  # fmt: skip
# The page has no workload profile (the workload page has): its performance per dollar is the default
# profile's metric, dense FP16, which the language's ``perf`` term and the "per TFLOP-hour" sort also use.
PERF_METRIC = GENERIC.metric
PERF_UNIT = "FP16 TFLOPS per USD/h"
# Past this many terms the "what each term alone matches" table would cost a query per term for little use.
_MAX_TERMS_EXPLAINED = 8


@dataclass(frozen=True)
class Control:
    """A filter control: the form field ``name`` writes the term ``field op value``."""

    name: str
    field: str
    op: str


CONTROLS = (
    Control("gpu", "gpu", "="),
    Control("count", "count", ">="),
    Control("region", "region", "="),
    Control("pricing", "pricing", "="),
    Control("provider", "provider", "="),
    Control("max_price", "price", "<="),
    Control("seller", "seller", "="),
    Control("free", "free", ">="),
    Control("gpumem", "mem", ">="),
    Control("vcpu", "vcpu", ">="),
    Control("ram", "ram", ">="),
    Control("disk", "disk", ">="),
    Control("net", "net", ">="),
    Control("reliability", "reliability", ">="),
    Control("max_gpuprice", "gpuprice", "<="),
    Control("perf", "perf", ">="),
)
_PARAMS = {c.name for c in CONTROLS} | {"prev"}
# The controls folded under "More filters" unless one of them is set, held by the box or refused.
MORE_FILTERS = ("free", "gpumem", "vcpu", "ram", "disk", "net", "reliability", "max_gpuprice", "perf")


def more_filters_open(form: OfferFilterForm) -> bool:
    """Whether the page shows the folded controls: one of them has a value, is held by the box, or was refused."""
    return any(
        form.initial.get(name) not in (None, "") or form.fields[name].disabled or name in form.errors
        for name in MORE_FILTERS
    ) or (form.is_bound and any(form.data.get(name) for name in MORE_FILTERS))


@dataclass
class SearchRequest:
    """What the offers page was asked: the query text, the sort, the page; ``redirect`` when the request came
    from the controls or an old link and the search's own address should replace it; ``form`` when a control's
    value was refused (the page then shows the refusal and the query as it stood)."""

    q: str
    sort: str
    page: int
    redirect: str | None = None
    form: OfferFilterForm | None = None


def search_url(q: str, sort: str = "price", page: int = 1) -> str:
    """The query string of a search: ``?q=...`` with ``sort`` and ``page`` only when not the defaults."""
    params: dict[str, str | int] = {"q": q} if q else {}
    if sort != "price":
        params["sort"] = sort
    if page > 1:
        params["page"] = page
    return "?" + urlencode(params) if params else "?"


def search_request(params: QueryDict) -> SearchRequest:
    """Read the page's parameters. A request that carries controls becomes a redirect to the merged query, unless
    a control's value is refused or the box's text cannot be parsed (then the controls are dropped and the page
    shows the parser's message)."""
    q = " ".join(params.get("q", "").split())
    sort = params.get("sort", "price")
    sort = sort if sort in SORTS else "price"
    page = _page_number(params.get("page", "1"))
    if not _PARAMS & set(params):
        return SearchRequest(q, sort, page)
    form = OfferFilterForm(params)
    if not form.is_valid():
        return SearchRequest(q, sort, 1, form=form)
    before = controls_from_text(params.get("prev", ""), form).values
    after = {c.name: form.cleaned_data.get(c.name) for c in CONTROLS}
    try:
        merged = merge(q, before=before, after=after)
    except QueryError:
        merged = q
    return SearchRequest(merged, sort, 1, redirect=search_url(merged, sort))


def _page_number(raw: str) -> int:
    return int(raw) if raw.isascii() and raw.isdigit() and 0 < len(raw) < 7 and int(raw) > 0 else 1


@dataclass
class ControlState:
    """The controls a query fills: ``values`` per control name (None for "any"), and ``held`` per control whose
    field the query uses in a form the control cannot show, with the terms that do."""

    values: dict[str, Any] = field(default_factory=dict)
    held: dict[str, list[str]] = field(default_factory=dict)


def controls_from_text(text: str, form: OfferFilterForm) -> ControlState:
    """``controls_from`` of ``text``'s terms; no control is filled from a query that does not parse."""
    try:
        return controls_from(parse(text), form)
    except QueryError:
        return ControlState()


def controls_from(terms: list[Term], form: OfferFilterForm) -> ControlState:
    """What the controls show for ``terms``."""
    state = ControlState()
    for control in CONTROLS:
        mine = [t for t in terms if t.field == control.field]
        if not mine:
            continue
        value = _control_value(control, mine[0], form) if len(mine) == 1 else None
        if value is None:
            state.held[control.name] = [t.text for t in mine]
        else:
            state.values[control.name] = value
    return state


def _control_value(control: Control, term: Term, form: OfferFilterForm) -> Any:
    """The value ``control`` shows for ``term``, or None when it cannot show it."""
    if term.op != control.op:
        return None
    if control.name == "gpu":
        assert isinstance(term.value, tuple)
        if len(term.value) != 1:
            return None
        choices = {str(key).lower(): str(key) for key, _ in form.fields["gpu"].choices if key}  # type: ignore[attr-defined]
        return choices.get(term.value[0].lower())
    if control.name == "seller":
        choices = {str(key).lower(): str(key) for key, _ in form.fields["seller"].choices if key}  # type: ignore[attr-defined]
        return choices.get(str(term.value).lower().replace(" ", "_"))
    if isinstance(term.value, Decimal):
        # A number the control cannot hold (a fraction in a whole-number box, beyond its bounds) stays in the box.
        bounds = form.fields[control.name]
        low, high = bounds.min_value, bounds.max_value  # type: ignore[attr-defined]
        if not low <= term.value <= high:
            return None
        if isinstance(bounds, forms.IntegerField):
            return int(term.value) if term.value == term.value.to_integral_value() else None
        places = bounds.decimal_places  # type: ignore[attr-defined]
        return term.value if -term.value.as_tuple().exponent <= places else None  # type: ignore[operator]
    return term.value


def _same(a: Any, b: Any) -> bool:
    a, b = (None if v in (None, "") else v for v in (a, b))
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return bool(a == b)


def _term_text(control: Control, value: Any) -> str:
    if isinstance(value, Decimal):
        value = format(value.normalize(), "f")
    return f"{control.field}{control.op}{value}"


def merge(text: str, *, before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """``text`` with each control whose value went from ``before`` to something else in ``after`` rewritten: its
    terms dropped and its new term put where the first of them stood (at the end if none did). The other terms
    keep their text and order. Raises ``QueryError`` when ``text`` does not parse."""
    pieces: list[tuple[str, str]] = [(t.field, t.text) for t in parse(text)]
    for control in CONTROLS:
        new = after.get(control.name)
        if _same(before.get(control.name), new):
            continue
        at = next((i for i, (f, _) in enumerate(pieces) if f == control.field), len(pieces))
        pieces = [p for p in pieces if p[0] != control.field]
        if new not in (None, ""):
            pieces.insert(min(at, len(pieces)), (control.field, _term_text(control, new)))
    return " ".join(text for _, text in pieces)


def display_form(terms: list[Term] | None) -> OfferFilterForm:
    """The controls as the query's ``terms`` fill them, with held ones disabled; all disabled when the query did
    not parse (``terms`` None)."""
    form = OfferFilterForm()
    if terms is None:
        # A refused search fills nothing; controls changed now could not be merged into it, so they wait for it.
        for control in form.fields.values():
            control.disabled = True
        return form
    state = controls_from(terms, form)
    form.initial = dict(state.values)
    for name in ("max_price", "max_gpuprice", "net", "reliability", "perf"):
        form.fields[name].widget.attrs["step"] = "any"
    for name, texts in state.held.items():
        form.fields[name].disabled = True
        form.fields[name].help_text = "set in the search box: " + " ".join(texts)
    return form


@dataclass(frozen=True)
class Relaxation:
    """For an empty result: one term, how many offers it matches alone, and how many the search matches without
    it (``without_url`` is that search's address)."""

    term: str
    alone: int
    without: int
    without_url: str


def relaxations(terms: list[Term], *, now: dt.datetime, sort: str) -> list[Relaxation]:
    """Per term of an empty search (at most ``_MAX_TERMS_EXPLAINED``): what it matches alone and what the search
    matches without it, the most rewarding removal first."""
    found = []
    for term in terms[:_MAX_TERMS_EXPLAINED]:
        rest = " ".join(t.text for t in terms if t is not term)
        found.append(
            Relaxation(
                term=term.text,
                alone=offers_query(term.text, now=now).count(),
                without=offers_query(rest, now=now).count(),
                without_url=search_url(rest, sort),
            )
        )
    return sorted(found, key=lambda r: (-r.without, r.alone))


@dataclass
class SearchResult:
    """The page of rows for a parsed search, or the parser's refusal."""

    terms: list[Term] | None
    error: QueryError | None
    rows: OfferGroupPage | None
    page: int
    pages: int


def search_run(q: str, *, sort: str, page: int, now: dt.datetime) -> SearchResult:
    """Run the search ``q``: page ``page`` (clamped to the last) of its rows."""
    try:
        terms = parse(q)
        queryset = offers_query(q, now=now, sort=sort)
    except QueryError as exc:
        return SearchResult(None, exc, None, 1, 1)
    rows = offer_groups(queryset, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    pages = max(1, -(-rows.group_total // PAGE_SIZE))
    if page > pages:
        page = pages
        rows = offer_groups(queryset, offset=(page - 1) * PAGE_SIZE, limit=PAGE_SIZE)
    return SearchResult(terms, None, rows, page, pages)
