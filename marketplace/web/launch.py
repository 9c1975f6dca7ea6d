"""Storefront pages for ordering a usable machine in three steps: configure (how long, which keys, what runs, who
may reach it), confirm (what will run where, for how long and at most at what cost) and place.

The configuration travels between the steps as a session draft (``marketplace/web/drafts.py``), so secret
values are never written into a page: a secret field left empty keeps the value given before, in this draft
or in the template the form started from.
"""

from __future__ import annotations

import copy
import ipaddress
import re
import secrets as random
import shlex
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.billing.credit import PaymentRequired, money
from marketplace.catalog.selectors import offer_list
from marketplace.clients import client_address
from marketplace.launch.config import (
    LaunchChoice,
    LaunchConfigInvalid,
    TemplateInvalid,
    launch_parse,
    launch_secrets,
    launch_template_save,
)
from marketplace.launch.gallery import GALLERY_PREFIX, GalleryEntry, gallery_get
from marketplace.launch.keys import ssh_key_list
from marketplace.launch.selectors import launch_template_list
from marketplace.matching import Amount
from marketplace.models import LaunchTemplate, Offer, Organization, Quote
from marketplace.orders.bids import offer_bidding
from marketplace.orders.clusters import ClusterRequest, cluster_place
from marketplace.orders.errors import OrderError
from marketplace.orders.quoting import quote_get
from marketplace.orders.selectors import BuyerPermission
from marketplace.orders.services import PlaceRequest, order_place
from marketplace.web.drafts import Draft, draft_load, draft_save
from marketplace.web.forms import ANYWHERE, EnvRow, LaunchForm, env_rows
from marketplace.web.gallery import gallery_start_take, start_choices
from marketplace.web.keys_templates import organization_template
from marketplace.web.launchview import launch_shown
from marketplace.web.orgs import buyer_access

BLANK_ENV_ROWS = 2  # empty rows offered below the filled ones (more appear after saving the form)


def _caller_cidr(request: HttpRequest) -> str:
    """The buyer's own address as a single-address range: who may reach the machine by default."""
    try:
        address = ipaddress.ip_address(client_address(request))
    except ValueError:
        return ""
    return f"{address}/{address.max_prefixlen}"


def _caller(request: HttpRequest) -> str | None:
    # The client behind the trusted proxies: behind the TLS proxy, the connection's own address is the proxy's.
    return client_address(request) or None


@dataclass(frozen=True)
class Target:
    """What is being ordered: an offer at its current price, or a quote at the price it locked. A quote for
    several machines (``nodes``) is placed as a cluster, and its price is the whole group's."""

    offer: Offer
    quote: Quote | None
    price_per_hour: Decimal

    @property
    def query(self) -> str:
        return f"quote={self.quote.public_id}" if self.quote else f"offer={self.offer.pk}"

    @property
    def nodes(self) -> int:
        return int((self.quote.demand or {}).get("nodes", 1)) if self.quote is not None else 1


def _target(organization: Organization, offer_id: Any, quote_id: Any) -> Target | None:
    if quote_id:
        quote = quote_get(organization=organization, public_id=str(quote_id))
        if quote is None:
            return None
        return Target(offer=quote.offer, quote=quote, price_per_hour=quote.price_per_hour)
    try:
        pk = int(offer_id)
    except (TypeError, ValueError):
        return None
    offer = offer_list(now=timezone.now()).select_related("account__provider").filter(pk=pk).first()
    return None if offer is None else Target(offer=offer, quote=None, price_per_hour=offer.price_usd)


def _form_record(post: QueryDict) -> dict[str, Any]:
    """The posted form as the draft keeps it to fill the form again: every field but the secret values."""
    record: dict[str, Any] = {}
    for name in post:
        if name in ("csrfmiddlewaretoken", "registry_password"):
            continue
        if name.startswith("env_value_") and post.get("env_secret_" + name.removeprefix("env_value_")):
            continue
        record[name] = post.getlist(name) if name == "ssh_keys" else post.get(name)
    return record


def _initial_from_spec(spec: dict[str, Any], caller_cidr: str, key_ids: set[str]) -> tuple[dict[str, Any], list]:
    """The form's fields and environment rows filled from a template's configuration."""
    workload = spec.get("workload") or {"kind": "none"}
    workload_ports = [int(p) for p in workload.get("ports") or []]
    cidrs = list(spec.get("allowed_cidrs") or [])
    access = "anywhere" if cidrs == ANYWHERE else "mine" if cidrs == [caller_cidr] else "custom"
    registry = workload.get("registry") or {}
    initial = {
        "workload_kind": workload.get("kind", "none"),
        "container_image": workload.get("image", ""),
        "command": shlex.join(workload.get("command") or []),
        "args": shlex.join(workload.get("args") or []),
        "container_ports": ", ".join(str(p) for p in workload_ports),
        "shm_size_gb": workload.get("shm_size_gb"),
        "registry_server": registry.get("server", ""),
        "registry_username": registry.get("username", ""),
        "script": workload.get("script", ""),
        "ports": ", ".join(str(p) for p in spec.get("ports") or [] if p != 22 and p not in workload_ports),
        "access": access,
        "cidrs": ", ".join(cidrs) if access == "custom" else "",
        "disk_gb": spec.get("disk_gb"),
        "image": spec.get("image") or "",
        "spend_cap_usd": spec.get("spend_cap_usd"),
        "on_silence": spec.get("on_silence") or "keep",
        "ssh_keys": [k["id"] for k in spec.get("ssh_keys") or [] if k["id"] in key_ids],
        "allow_failover": True,
    }
    rows = [
        EnvRow(index=i, name=e["name"], value=e.get("value", ""), secret=bool(e.get("secret")),
               kept=bool(e.get("secret")))
        for i, e in enumerate(workload.get("env") or [])
    ]  # fmt: skip
    return initial, rows


def _prior_secrets(draft: Draft | None, start: LaunchTemplate | None) -> dict[str, Any]:
    """Secret values given before, which an empty secret field keeps: this draft's, else the template's."""
    # The template's are decrypted only to carry them into the new configuration, server-side; never rendered.
    prior = launch_secrets(start.configuration) if start is not None else {}
    mine = draft.secrets if draft is not None else {}
    return {
        "env": {**(prior.get("env") or {}), **(mine.get("env") or {})},
        "registry_password": mine.get("registry_password") or prior.get("registry_password") or "",
    }


# Where each part of a launch configuration is on the form (``LaunchConfigInvalid.fields`` keys, in order).
_FIELD_OF = [
    ("workload.registry.password", "registry_password"),
    ("workload.registry.username", "registry_username"),
    ("workload.registry", "registry_server"),
    ("workload.image", "container_image"),
    ("workload.command", "command"),
    ("workload.args", "args"),
    ("workload.ports", "container_ports"),
    ("workload.shm_size_gb", "shm_size_gb"),
    ("workload.script", "script"),
    ("workload.env", "workload_kind"),
    ("workload", "workload_kind"),
    ("image", "image"),
    ("disk_gb", "disk_gb"),
    ("ports", "ports"),
    ("allowed_cidrs", "cidrs"),
    ("ssh_keys", "ssh_keys"),
    ("spend_cap_usd", "spend_cap_usd"),
    ("on_silence", "on_silence"),
]


_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_ENV_ITEM = re.compile(r"^workload\.env\[(\d+)\]")


_INDEX = re.compile(r"\[(\d+)\]")


def _apply_errors(fields: dict[str, str], form: LaunchForm, used_rows: list[EnvRow]) -> None:
    """Put each of the service's field errors next to its field on the form."""
    for key, message in fields.items():
        path = key.removeprefix("launch.")
        env = _ENV_ITEM.match(path)
        if env and int(env.group(1)) < len(used_rows):
            used_rows[int(env.group(1))].error = message
            continue
        name = next(
            (f for prefix, f in _FIELD_OF if path == prefix or path.startswith((f"{prefix}.", f"{prefix}["))), None
        )
        if name == "cidrs" and form.data.get("access") != "custom":
            name = "access"
        if path == "workload" and form.data.get("workload_kind") == "script":
            name = "script"  # the boot script as a whole is too large: the script is what to shorten
        if name is None:
            form.add_error(None, f"{key}: {message}")
            continue
        index = _INDEX.search(path)
        form.add_error(name, f"item {int(index.group(1)) + 1}: {message}" if index else message)


def _configure_page(
    request: HttpRequest,
    organization: Organization,
    target: Target,
    form: LaunchForm,
    rows: list[EnvRow],
    *,
    nonce: str,
    start: LaunchTemplate | None,
    registry_kept: bool,
    status: int = 200,
    gallery: GalleryEntry | None = None,
) -> HttpResponse:
    filled = [r for r in rows if r.name or r.value or r.secret]
    shown = filled + [EnvRow(index=0) for _ in range(BLANK_ENV_ROWS)]
    for i, row in enumerate(shown):
        row.index = i
    chosen = form["ssh_keys"].value() or []
    keys = list(ssh_key_list(organization=organization))
    return render(
        request,
        "storefront/order_configure.html",
        {
            "target": target,
            "form": form,
            "env_rows": shown,
            "keys": [(k, str(k.public_id) in chosen) for k in keys],
            "nonce": nonce,
            "start": start,
            "templates": launch_template_list(organization=organization),
            "gallery_choices": start_choices(),
            "gallery_start": gallery,
            "caller_cidr": _caller_cidr(request),
            "registry_kept": registry_kept,
            "env_errors": any(r.error for r in shown),
            "kind": form["workload_kind"].value() or "none",
            "access": form["access"].value() or "mine",
            "here": request.get_full_path(),
            "bidding": offer_bidding(target.offer) if target.quote is None else None,
        },
        status=status,
    )


def _choices(organization: Organization) -> list[tuple[str, str]]:
    return [(str(k.public_id), k.name) for k in list(ssh_key_list(organization=organization))]


@login_required
@require_http_methods(["GET", "POST"])
def order_configure(request: HttpRequest) -> HttpResponse:
    """Step 1: the order's launch configuration. ``?offer=<id>`` or ``?quote=<id>``; ``&start=<template id>``
    fills the form from a template; ``?draft=<nonce>`` comes back to a draft from the confirmation."""
    organization = buyer_access(request, BuyerPermission.ORDER).organization
    source = request.POST if request.method == "POST" else request.GET
    draft = draft_load(request, source.get("nonce") or source.get("draft") or "", organization=organization.pk)
    if draft is not None and draft.placed:
        draft = None  # that one became an order; this form starts a new one
    offer_id: Any = source.get("offer")
    quote_id: Any = source.get("quote")
    if draft is not None and request.method == "GET":
        offer_id, quote_id = draft.offer, draft.quote
    target = _target(organization, offer_id, quote_id)
    if target is None and quote_id:
        raise Http404("no such quote")  # another organisation's quote is not there at all
    if target is None:
        messages.error(request, "That offer is no longer for sale: choose another.")
        return redirect("storefront:offers")
    start_id = source.get("start") or (draft.start if draft else "")
    start = organization_template(organization, start_id) if start_id else None
    gallery = gallery_get(start_id) if start_id.startswith(GALLERY_PREFIX) else None
    if request.method == "GET" and draft is None and not start_id:
        gallery = gallery_start_take(request)  # "Use" on the Templates page chose it before the offer
    posted = request.POST.get("nonce", "")
    if draft is not None:
        nonce = draft.nonce
    elif request.method == "POST" and _NONCE.fullmatch(posted):
        nonce = posted  # the form's first submission: its draft starts now, under the form's nonce
    else:
        nonce = random.token_urlsafe(18)
    if request.method == "GET":
        return _configure_get(request, organization, target, draft, start, nonce, gallery)
    return _configure_post(request, organization, target, draft, start, nonce)


def _configure_get(
    request: HttpRequest,
    organization: Organization,
    target: Target,
    draft: Draft | None,
    start: LaunchTemplate | None,
    nonce: str,
    gallery: GalleryEntry | None = None,
) -> HttpResponse:
    choices = _choices(organization)
    if draft is not None:
        # Back from the confirmation: the form as it was sent, its secret values kept in the draft.
        form = LaunchForm(draft.form, keys=choices)
        form.is_valid()
        kept = (draft.secrets or {}).get("env") or {}
        drafted = env_rows(draft.form)
        for row in drafted:
            row.kept = row.secret and row.name in kept
        return _configure_page(request, organization, target, form, drafted, nonce=nonce, start=start,
                               registry_kept=bool(draft.secrets.get("registry_password")))  # fmt: skip
    initial: dict[str, Any] = {"ssh_keys": [k for k, _ in choices], "workload_kind": "none", "access": "mine",
                               "allow_failover": True}  # fmt: skip
    rows: list[EnvRow] = []
    registry_kept = False
    if start is not None:
        initial, rows = _initial_from_spec(start.configuration.spec, _caller_cidr(request), {k for k, _ in choices})
        registry_kept = bool((start.configuration.spec.get("workload") or {}).get("registry"))
    elif gallery is not None:
        initial, rows = _initial_from_gallery(request, gallery, {k for k, _ in choices})
    # A fixed-duration quote runs for its hours; a fixed-work quote's hours are only an estimate from
    # datasheets, and stopping there could cut the job short: the buyer sets a run time or a spend cap.
    if target.quote is not None and (target.quote.demand or {}).get("amount") != Amount.WORK:
        initial["duration_hours"] = target.quote.duration_hours
    form = LaunchForm(initial=initial, keys=choices)
    return _configure_page(request, organization, target, form, rows, nonce=nonce, start=start,
                           registry_kept=registry_kept, gallery=gallery)  # fmt: skip


def _initial_from_gallery(request: HttpRequest, entry: GalleryEntry, key_ids: set[str]) -> tuple[dict[str, Any], list]:
    """The form filled from a gallery entry: its workload and disk, every key of the organisation, reachable
    from the buyer's address. Its secret variables start empty: the buyer types them."""
    spec = {**copy.deepcopy(dict(entry.launch)), "allowed_cidrs": [_caller_cidr(request)],
            "ssh_keys": [{"id": k} for k in sorted(key_ids)]}  # fmt: skip
    initial, rows = _initial_from_spec(spec, _caller_cidr(request), key_ids)
    for row in rows:
        row.kept = False
    return initial, rows


def _configure_post(
    request: HttpRequest,
    organization: Organization,
    target: Target,
    draft: Draft | None,
    start: LaunchTemplate | None,
    nonce: str,
) -> HttpResponse:
    post = request.POST
    form = LaunchForm(post, keys=_choices(organization))
    rows = env_rows(post)
    prior = _prior_secrets(draft, start)
    prior_env = prior.get("env") or {}
    for row in rows:
        if row.secret and not row.value and row.name in prior_env:
            row.value = prior_env[row.name]
    registry_password = post.get("registry_password") or prior.get("registry_password") or ""
    kept = Draft(
        nonce=nonce,
        organization=organization.pk,
        offer=None if target.quote else target.offer.pk,
        quote=str(target.quote.public_id) if target.quote else None,
        start=str(start.public_id) if start else "",
        form=_form_record(post),
        secrets={"env": {r.name: r.value for r in rows if r.secret and r.name and r.value},
                 "registry_password": registry_password},
    )  # fmt: skip
    for row in rows:
        row.kept = row.secret and bool(row.value)
    valid = form.is_valid()
    used = [r for r in rows if r.name or r.value]
    for row in used:
        if row.secret and not row.value:
            row.error = "enter the value: secret values are kept, never shown again"
            valid = False
    template_saved = ""
    if valid:
        data = form.launch_data(
            [{"name": r.name, "value": r.value, "secret": r.secret} for r in used], registry_password or None
        )
        choice = LaunchChoice(data=data, caller_address=_caller(request))
        try:
            if form.cleaned_data["save_template"]:
                template_saved = launch_template_save(
                    organization=organization,
                    user=request.user,  # type: ignore[arg-type]
                    name=form.cleaned_data["save_name"],
                    choice=choice,
                ).name
            else:
                launch_parse(
                    data,
                    keys=list(ssh_key_list(organization=organization)),
                    caller_address=choice.caller_address,
                )
        except LaunchConfigInvalid as exc:
            _apply_errors(exc.fields, form, used)
            valid = False
        except TemplateInvalid as exc:
            form.add_error("save_name", str(exc).removeprefix("name: "))
            valid = False
    if not valid:
        draft_save(request, kept)
        return _configure_page(request, organization, target, form, rows, nonce=nonce, start=start,
                               registry_kept=bool(registry_password), status=400)  # fmt: skip
    d = form.cleaned_data
    kept.launch = data
    kept.duration_hours = None if d["duration_hours"] is None else format(d["duration_hours"], "f")
    kept.allow_failover = d["allow_failover"]
    kept.max_price_per_hour = None if d["max_price_per_hour"] is None else format(d["max_price_per_hour"], "f")
    kept.bid_per_gpu_hour = None if d["bid_per_gpu_hour"] is None else format(d["bid_per_gpu_hour"], "f")
    if template_saved:
        kept.template_saved = template_saved
        kept.form.pop("save_template", None)  # saved once; coming back to change the order must not save it again
        messages.success(request, f"Launch template {template_saved} saved.")
    draft_save(request, kept)
    return redirect(f"{reverse('storefront:order-confirm')}?draft={nonce}")


def _cost(price: Decimal, hours: Decimal | None, cap: Decimal | None) -> tuple[Decimal, Decimal]:
    """(the most the order can cost, the hours that buys) for a duration, a spend cap, or both."""
    limits = [(hours * price, hours)] if hours is not None else []
    if cap is not None:
        limits.append((cap, cap / price if price else Decimal(0)))
    return min(limits)


@login_required
@require_http_methods(["GET"])
def order_confirm(request: HttpRequest) -> HttpResponse:
    """Step 2: what will run, where, for how long and at most at what cost, who may reach it. Confirm places
    it (``order_place_view``)."""
    organization = buyer_access(request, BuyerPermission.ORDER).organization
    draft = draft_load(request, request.GET.get("draft", ""), organization=organization.pk)
    if draft is not None and draft.placed:
        return _placed(draft)
    if draft is None or draft.launch is None:
        messages.error(request, "That order form has expired or was not finished; configure the order again.")
        return redirect("storefront:offers")
    target = _target(organization, draft.offer, draft.quote)
    if target is None:
        messages.error(request, "That offer is no longer for sale; choose another.")
        return redirect("storefront:offers")
    configure = f"{reverse('storefront:order-configure')}?draft={draft.nonce}"
    try:
        spec, _ = launch_parse(
            draft.launch,
            keys=list(ssh_key_list(organization=organization)),
            caller_address=_caller(request),
        )
    except LaunchConfigInvalid as exc:
        # Something changed since the form was sent (a key removed meanwhile): back to the form with why.
        messages.error(request, f"The configuration no longer holds: {exc}")
        return redirect(configure)
    hours = None if draft.duration_hours is None else Decimal(draft.duration_hours)
    cap = None if spec["spend_cap_usd"] is None else Decimal(spec["spend_cap_usd"])
    most, runs = _cost(target.price_per_hour, hours, cap)
    return render(
        request,
        "storefront/order_confirm.html",
        {
            "target": target,
            "launch": launch_shown(spec),
            "hours": hours,
            "cap": cap,
            "most": most,
            "runs_hours": runs,
            "draft": draft,
            "configure": configure,
            "caller_cidr": _caller_cidr(request),
        },
    )


@login_required
@require_POST
def order_place_view(request: HttpRequest) -> HttpResponse:
    """Step 3: place the confirmed draft. The draft's nonce is the order's idempotency key, and a placed draft
    remembers its order, so a second click, a reload or a resubmit leads to the same order."""
    organization = buyer_access(request, BuyerPermission.ORDER).organization
    draft = draft_load(request, request.POST.get("nonce", ""), organization=organization.pk)
    if draft is not None and draft.placed:
        messages.info(request, f"Order {draft.placed} was already placed from this form.")
        return _placed(draft)
    if draft is None or draft.launch is None:
        messages.error(request, "That order form has expired or was not finished; configure the order again.")
        return redirect("storefront:offers")
    target = _target(organization, draft.offer, draft.quote)
    if target is not None and target.nodes > 1:
        return _cluster_place(request, organization, draft)
    try:
        result = order_place(
            organization=organization,
            user=request.user,  # type: ignore[arg-type]
            request=PlaceRequest(
                offer_id=draft.offer,
                quote_id=draft.quote,
                duration_hours=None if draft.duration_hours is None else Decimal(draft.duration_hours),
                allow_failover=draft.allow_failover,
                max_price_per_hour=None if draft.max_price_per_hour is None else Decimal(draft.max_price_per_hour),
                bid_per_gpu_hour=None if draft.bid_per_gpu_hour is None else Decimal(draft.bid_per_gpu_hour),
                launch=LaunchChoice(data=draft.launch, caller_address=_caller(request)),
            ),
            idempotency_key=draft.nonce,
        )
    except LaunchConfigInvalid as exc:
        # The provider's own limits (checked at placing) or a change since: the form, with each error in place.
        target = _target(organization, draft.offer, draft.quote)
        if target is None:
            messages.error(request, "That offer is no longer for sale; choose another.")
            return redirect("storefront:offers")
        form = LaunchForm(draft.form, keys=_choices(organization))
        form.is_valid()
        rows = env_rows(draft.form)
        for row in rows:
            row.kept = row.secret and row.name in (draft.secrets.get("env") or {})
        _apply_errors(exc.fields, form, [r for r in rows if r.name or r.value])
        start = organization_template(organization, draft.start) if draft.start else None
        return _configure_page(request, organization, target, form, rows, nonce=draft.nonce, start=start,
                               registry_kept=bool(draft.secrets.get("registry_password")), status=400)  # fmt: skip
    except PaymentRequired as exc:
        # To Billing, with the way back to this order once the credit is there.
        messages.error(request, f"Not placed yet: add at least {money(exc.shortfall_minor)} of credit first.")
        return redirect(f"{reverse('storefront:billing')}?resume={draft.nonce}")
    except OrderError as exc:
        messages.error(request, f"Could not place the order: {exc}")
        if draft.quote:
            return redirect("storefront:workload")
        return redirect(f"{reverse('storefront:order-confirm')}?draft={draft.nonce}")
    order = result.order
    # The draft forgets its secrets: the order keeps them encrypted, and this session needs only the order's id.
    draft.placed, draft.launch, draft.secrets = str(order.public_id), None, {}
    draft_save(request, draft)
    if result.created:
        messages.success(request, f"Order {order.public_id} placed; its machine is being started.")
    for warning in result.warnings:
        messages.warning(request, warning)
    return redirect("storefront:order-detail", order_id=order.public_id)


def _placed(draft: Draft) -> HttpResponse:
    """Where a draft placed before leads: its order, or its cluster."""
    if draft.placed.startswith(_CLUSTER):
        return redirect("storefront:cluster-detail", cluster_id=draft.placed.removeprefix(_CLUSTER))
    return redirect("storefront:order-detail", order_id=draft.placed)


_CLUSTER = "cluster:"


def _cluster_place(request: HttpRequest, organization: Organization, draft: Draft) -> HttpResponse:
    """Place a multi-node quote's confirmed draft as a cluster (marketplace/orders/clusters.py), idempotent on
    the draft's nonce like an order. The hourly cap the form took is per machine."""
    try:
        placed = cluster_place(
            organization=organization,
            user=request.user,  # type: ignore[arg-type]
            request=ClusterRequest(
                quote_id=draft.quote,
                duration_hours=None if draft.duration_hours is None else Decimal(draft.duration_hours),
                allow_failover=draft.allow_failover,
                max_price_per_node_hour=None if draft.max_price_per_hour is None else Decimal(draft.max_price_per_hour),
                launch=LaunchChoice(data=draft.launch, caller_address=_caller(request)),
            ),
            idempotency_key=draft.nonce,
        )
    except (OrderError, LaunchConfigInvalid) as exc:
        messages.error(request, f"Could not place the cluster: {exc}")
        return redirect(f"{reverse('storefront:order-confirm')}?draft={draft.nonce}")
    cluster = placed.cluster
    draft.placed, draft.launch, draft.secrets = f"{_CLUSTER}{cluster.public_id}", None, {}
    draft_save(request, draft)
    if placed.created:
        messages.success(
            request, f"Cluster {cluster.public_id} placed; its {cluster.nodes} machines are being started."
        )
    return redirect("storefront:cluster-detail", cluster_id=cluster.public_id)
