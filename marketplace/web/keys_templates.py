"""Storefront pages for what an organisation launches with: its SSH keys and its launch templates (listed,
added, deleted). Ordering with them is ``marketplace/web/launch.py``."""

from __future__ import annotations

import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.launch.config import (
    launch_template_delete,
    launch_template_get,
)
from marketplace.launch.gallery import gallery_list
from marketplace.launch.keys import SshKeyRefused, ssh_key_add, ssh_key_delete, ssh_key_get, ssh_key_list
from marketplace.launch.selectors import launch_template_list
from marketplace.models import LaunchTemplate, Organization
from marketplace.orders.selectors import BuyerPermission, buyer_role_allows
from marketplace.web.forms import SshKeyForm
from marketplace.web.launchview import launch_shown
from marketplace.web.orgs import buyer_access


def next_url(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return ""


@login_required
@require_http_methods(["GET", "POST"])
def keys(request: HttpRequest) -> HttpResponse:
    """The organisation's SSH public keys; members and owners add one (pasted or uploaded) here. A refused key
    shows the service's reason, and the form comes back empty: the text is never sent back to the browser."""
    membership = buyer_access(request, BuyerPermission.ORDER if request.method == "POST" else BuyerPermission.READ)
    organization = membership.organization
    form = SshKeyForm(request.POST, request.FILES) if request.method == "POST" else SshKeyForm()
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                key = ssh_key_add(
                    organization=organization,
                    user=request.user,  # type: ignore[arg-type]
                    public_key=form.cleaned_data["public_key"],
                    name=form.cleaned_data["name"],
                )
            except SshKeyRefused as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
            else:
                messages.success(request, f"Key {key.name} added ({key.fingerprint}).")
                return redirect(next_url(request) or reverse("storefront:keys"))
        status = 400
    return render(
        request,
        "storefront/keys.html",
        {
            "organization": organization,
            "form": form,
            "keys": ssh_key_list(organization=organization).order_by("name"),
            "can_edit": buyer_role_allows(membership.role, BuyerPermission.ORDER),
            "next": next_url(request),
        },
        status=status,
    )


@login_required
@require_POST
def key_delete(request: HttpRequest, key_id: str) -> HttpResponse:
    key = ssh_key_get(organization=buyer_access(request, BuyerPermission.ORDER).organization, public_id=key_id)
    if key is None:
        raise Http404("no such SSH key")
    ssh_key_delete(key=key)
    messages.success(request, f"Key {key.name} removed. Machines already launched keep the keys they got.")
    return redirect("storefront:keys")


@login_required
def templates(request: HttpRequest) -> HttpResponse:
    """The organisation's launch templates (made from the order form's "save as template"), and the broker's
    gallery of ready ones to order from or copy (``marketplace/web/gallery.py``)."""
    membership = buyer_access(request)
    rows = [(t, launch_shown(t.configuration.spec)) for t in launch_template_list(organization=membership.organization)]
    return render(
        request,
        "storefront/templates.html",
        {
            "organization": membership.organization,
            "templates": rows,
            "gallery": gallery_list(),
            "can_edit": buyer_role_allows(membership.role, BuyerPermission.ORDER),
        },
    )


@login_required
@require_POST
def template_delete(request: HttpRequest, template_id: str) -> HttpResponse:
    organization = buyer_access(request, BuyerPermission.ORDER).organization
    template = organization_template(organization, template_id)
    if template is None:
        raise Http404("no such launch template")
    launch_template_delete(template=template)
    messages.success(request, f"Template {template.name} deleted; orders placed with it keep their configuration.")
    return redirect("storefront:templates")


def organization_template(organization: Organization, template_id: str) -> LaunchTemplate | None:
    # By id only: the service also finds templates by name, which a URL should not.
    if not re.fullmatch(r"[0-9a-fA-F-]{32,36}", template_id or ""):
        return None
    return launch_template_get(organization=organization, ref=template_id)
