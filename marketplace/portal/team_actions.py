"""The team page's actions, shared by the provider portal and the buyer storefront: each view checks who may act
and where to go back; these find the object in the caller's organisation (404 otherwise), call the service and
say what happened."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404, HttpRequest
from django.urls import reverse

from marketplace.models import Organization
from marketplace.portal import selectors
from marketplace.portal.emails import invitation_email_send
from marketplace.portal.services import (
    PortalError,
    invitation_create,
    invitation_revoke,
    membership_remove,
    membership_role_set,
)


def form_error(form: forms.Form, error: PortalError) -> None:
    """A service's refusal on the form: on the field it names, or above the form."""
    form.add_error(error.field if error.field in form.fields else None, error.message)


def invite_action(request: HttpRequest, organization: Organization, form: forms.Form, invitation_url: str) -> str:
    """Invite the (valid) form's address with its role and email them the link; the link, to show once on
    this response, or "" when the service refused (the reason is put on the form). ``invitation_url`` names
    the route that accepts the link's token."""
    try:
        created, token = invitation_create(
            organization=organization,
            email=form.cleaned_data["email"],
            role=form.cleaned_data["role"],
            by=request.user,  # type: ignore[arg-type]
        )
    except PortalError as error:
        form_error(form, error)
        return ""
    link = request.build_absolute_uri(reverse(invitation_url, args=[token]))
    if invitation_email_send(invitation=created, link=link):
        messages.success(request, f"Invitation emailed to {created.email}. The link is also below, shown once.")
    else:
        messages.warning(
            request, f"Invitation for {created.email} created, but the email could not be sent: copy the link below "
            "and pass it on yourself; it is shown once."
        )  # fmt: skip
    return link


def invitation_revoke_action(request: HttpRequest, organization: Organization, invitation_id: int) -> None:
    found = selectors.invitation_get(organization=organization, invitation_id=invitation_id)
    if found is None:
        raise Http404("no such invitation")
    if invitation_revoke(invitation=found):
        messages.success(request, f"Invitation for {found.email} revoked.")
    else:
        messages.info(request, f"The invitation for {found.email} was already {found.status().label}.")


def member_update_action(
    request: HttpRequest, organization: Organization, membership_id: int, role_form: type[forms.Form]
) -> None:
    """Change a member's role, or (``remove`` in the POST) take them off the team."""
    member = selectors.member_get(organization=organization, membership_id=membership_id)
    if member is None:
        raise Http404("no such member")
    name = member.user.get_username()
    try:
        if "remove" in request.POST:
            membership_remove(membership=member, by=request.user)  # type: ignore[arg-type]
            messages.success(request, f"{name} is no longer in {organization.name}.")
            return
        form = role_form(request.POST, prefix=f"m{member.pk}")
        if not form.is_valid():
            messages.error(request, f"Role: {form.errors['role'][0]}")
            return
        membership_role_set(membership=member, role=form.cleaned_data["role"], by=request.user)  # type: ignore[arg-type]
        messages.success(request, f"{name} is now {form.cleaned_data['role']}.")
    except PortalError as error:
        messages.error(request, f"{name} keeps their role: {error.message}.")
