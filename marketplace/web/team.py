"""Buyer organisations in the storefront: signing up, switching between one's organisations, the team page
(members, invitations, roles, leaving) and invitation links.

The writes are the provider portal's team services (marketplace/portal/services.py), which check the roles
against the organisation's kind and never leave an organisation without an owner. Another organisation's
members and invitations are 404; a role short of an action is 403 (``buyer_access``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import Resolver404, resolve, reverse
from django.utils.cache import patch_cache_control
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods, require_POST

from marketplace.api.tokens import ACTIVE_ORGANIZATION
from marketplace.models import InvitationStatus, Membership, OrganizationKind, Role
from marketplace.orders.selectors import BuyerPermission, buyer_membership_list, buyer_role_allows
from marketplace.portal import selectors
from marketplace.portal.forms import InvitationSignupForm
from marketplace.portal.services import (
    PortalError,
    buyer_signup,
    invitation_accept,
    invitation_signup,
    membership_remove,
)
from marketplace.portal.team_actions import form_error, invitation_revoke_action, invite_action, member_update_action
from marketplace.web.forms import BuyerInviteForm, BuyerRoleForm, BuyerSignupForm
from marketplace.web.orgs import activate, active_membership, buyer_access

AUTH_BACKEND = "django.contrib.auth.backends.ModelBackend"


# --- Signing up and switching ---------------------------------------------------------------------------------


@sensitive_post_parameters("password1", "password2")
@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    """A new person and their buyer organisation, them its owner; they land on the offers, signed in."""
    if active_membership(request) is not None:
        return redirect("storefront:offers")
    form = BuyerSignupForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        try:
            user, organization = buyer_signup(
                username=data["username"],
                email=data["email"],
                password=data["password1"],
                organization_name=data["organization_name"],
            )
        except PortalError as error:
            form_error(form, error)
        else:
            login(request, user, backend=AUTH_BACKEND)
            activate(request, organization)
            messages.success(request, f"Welcome to GPU Broker. {organization.name} is ready: you are its owner.")
            return redirect("storefront:offers")
    return render(request, "registration/signup.html", {"form": form})


# Pages that show no single object, so they make sense in any organisation after a switch.
_LIST_PAGES = {"offers", "workload", "compare", "orders", "spending", "tokens", "webhooks", "team"}


def _after_switch(request: HttpRequest) -> str:
    """Back to the page the switcher was used on when it is a list; an order or a webhook of the previous
    organisation would be 404 in the new one, so those go to the orders."""
    target = request.POST.get("next", "")
    if url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        try:
            match = resolve(target.split("?", 1)[0])
        except Resolver404:
            match = None
        if match is not None and match.namespace == "storefront" and match.url_name in _LIST_PAGES:
            return target
    return reverse("storefront:orders")


@login_required
@require_POST
def organization_switch(request: HttpRequest) -> HttpResponse:
    """Act for another of the user's buyer organisations from now on (kept in the session)."""
    wanted = request.POST.get("organization", "")
    chosen = next((m for m in buyer_membership_list(request.user) if str(m.organization_id) == wanted), None)
    if chosen is None:
        raise Http404("no such organisation of yours")
    activate(request, chosen.organization)
    messages.success(request, f"Now acting for {chosen.organization.name} as {chosen.get_role_display()}.")
    return redirect(_after_switch(request))


# --- The team -------------------------------------------------------------------------------------------------


def _team_page(request: HttpRequest, membership: Membership, form: BuyerInviteForm, link: str) -> HttpResponse:
    organization = membership.organization
    can_team = buyer_role_allows(membership.role, BuyerPermission.TEAM)
    people = list(selectors.member_list(organization=organization))
    owners = sum(1 for m in people if m.role == Role.OWNER)
    # Each member with their role form and whether they are the last owner (whose role the page locks).
    members = [
        (m, BuyerRoleForm(initial={"role": m.role}, prefix=f"m{m.pk}"), m.role == Role.OWNER and owners == 1)
        for m in people
    ]
    return render(
        request,
        "storefront/team.html",
        {
            "organization": organization,
            "membership": membership,
            "members": members,
            "only_owner": membership.role == Role.OWNER and owners == 1,
            "invitations": selectors.invitation_list(organization=organization) if can_team else [],
            "form": form,
            "link": link,
            "can_team": can_team,
        },
    )


@login_required
@require_http_methods(["GET", "POST"])
def team(request: HttpRequest) -> HttpResponse:
    """Members with their role and join date; owners also see the invitations and invite (a POST), the link
    shown once, on this response only."""
    membership = buyer_access(request, BuyerPermission.TEAM if request.method == "POST" else BuyerPermission.READ)
    form = BuyerInviteForm(request.POST if request.method == "POST" else None)
    link = ""
    if form.is_bound and form.is_valid():
        link = invite_action(request, membership.organization, form, "storefront:invitation")
        if link:
            form = BuyerInviteForm()
    response = _team_page(request, membership, form, link)
    if link:
        patch_cache_control(response, no_store=True)  # the link must not linger in a cache
    elif form.is_bound:
        response.status_code = 400
    return response


@login_required
@require_POST
def invitation_revoke_view(request: HttpRequest, invitation_id: int) -> HttpResponse:
    membership = buyer_access(request, BuyerPermission.TEAM)
    invitation_revoke_action(request, membership.organization, invitation_id)
    return redirect("storefront:team")


@login_required
@require_POST
def member_update(request: HttpRequest, membership_id: int) -> HttpResponse:
    membership = buyer_access(request, BuyerPermission.TEAM)
    member_update_action(request, membership.organization, membership_id, BuyerRoleForm)
    return redirect("storefront:team")


@login_required
@require_POST
def leave(request: HttpRequest) -> HttpResponse:
    """Leave the active organisation; refused to its last owner. The session falls back to another one."""
    membership = buyer_access(request)
    try:
        membership_remove(membership=membership, by=request.user)  # type: ignore[arg-type]
    except PortalError as error:
        messages.error(request, f"You cannot leave {membership.organization.name}: {error.message}.")
        return redirect("storefront:team")
    request.session.pop(ACTIVE_ORGANIZATION, None)
    after = active_membership(request, fresh=True)
    left = membership.organization.name
    if after is None:
        messages.success(request, f"You left {left}. You are in no buyer organisation now.")
    else:
        messages.success(request, f"You left {left}; now acting for {after.organization.name}.")
    return redirect("storefront:offers")


# --- Invitation links -----------------------------------------------------------------------------------------


@never_cache
@sensitive_post_parameters("password1", "password2")
@require_http_methods(["GET", "POST"])
def invitation(request: HttpRequest, token: str) -> HttpResponse:
    """An invitation to a buyer organisation: accept while signed in with the invited address, or sign up with
    it and join in one step. Joining switches to the organisation; the others stay in the switcher."""
    found = selectors.invitation_by_token(token)
    if found is None or found.organization.kind != OrganizationKind.BUYER:
        raise Http404("no such invitation")
    status = found.status()
    form = InvitationSignupForm(request.POST or None) if not request.user.is_authenticated else None
    context: dict[str, Any] = {"invitation": found, "status": status, "form": form, "error": ""}
    if status != InvitationStatus.OPEN:
        return render(request, "invitation.html", context, status=410)
    if request.method == "POST":
        try:
            if request.user.is_authenticated:
                invitation_accept(invitation=found, user=request.user)
            elif form is not None and form.is_valid():
                user = invitation_signup(
                    invitation=found, username=form.cleaned_data["username"], password=form.cleaned_data["password1"]
                )
                login(request, user, backend=AUTH_BACKEND)
            else:
                return render(request, "invitation.html", context, status=400)
        except PortalError as error:
            if form is not None:
                form_error(form, error)
            else:
                context["error"] = error.message
            return render(request, "invitation.html", context, status=400)
        activate(request, found.organization)
        messages.success(request, f"You joined {found.organization.name} as {found.get_role_display()}.")
        return redirect("storefront:orders")
    return render(request, "invitation.html", context)
