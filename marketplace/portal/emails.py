"""Emails to people who are not in the broker yet: team invitations, for buyer and provider organisations."""

from __future__ import annotations

import logging
import smtplib

from django.conf import settings
from django.core.mail import send_mail
from django.template.loader import render_to_string

from marketplace.models import Invitation

log = logging.getLogger(__name__)


def invitation_email_send(*, invitation: Invitation, link: str) -> bool:
    """Email ``link`` (it carries the invitation's token, which is not stored) to the invited address; False
    when the mail server refused or could not be reached, which the inviter is told, with the link to pass on."""
    context = {
        "organization": invitation.organization.name,
        "role": invitation.get_role_display(),
        "inviter": invitation.invited_by.get_username() if invitation.invited_by else "",
        "link": link,
        "expires_at": invitation.expires_at,
    }
    subject = f"You are invited to join {invitation.organization.name} on the GPU Broker"
    try:
        send_mail(
            subject,
            render_to_string("email/invitation.txt", context),
            settings.DEFAULT_FROM_EMAIL,
            [invitation.email],
        )
    except (smtplib.SMTPException, OSError) as exc:
        # The address is personal data: the log names the invitation, not who it was for.
        log.warning("invitation %s: the email was not sent: %s", invitation.pk, exc)
        return False
    return True
