"""Email verification: a signed, expiring link proves a person reads their address (the first top-up waits).

The token carries the user and the address, signed with the site's key, so nothing is stored until it is used,
and a link for an address the user has since changed no longer verifies anything.
"""

from __future__ import annotations

import logging
import smtplib

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core import signing
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.template.loader import render_to_string
from django.utils import timezone

from marketplace.models.billing import EmailVerification

log = logging.getLogger(__name__)

_SALT = "broker.email-verification"
MAX_AGE_S = 3 * 24 * 3600


class VerificationFailed(ValueError):
    """A link that verifies nothing: tampered, expired, or for an address the account no longer has."""


def email_verification_token(user: AbstractBaseUser) -> str:
    return signing.dumps({"u": user.pk, "e": getattr(user, "email", "").lower()}, salt=_SALT)


def email_verification_send(*, user: AbstractBaseUser, link: str) -> bool:
    """Email the verification ``link`` to the user's address; False when there is none or the mail server
    refused (the page says so)."""
    email = getattr(user, "email", "")
    if not email:
        return False
    context = {"username": user.get_username(), "link": link, "days": MAX_AGE_S // 86400}
    try:
        send_mail(
            "Verify your email address for the GPU Broker",
            render_to_string("email/verify_email.txt", context),
            settings.DEFAULT_FROM_EMAIL,
            [email],
        )
    except (smtplib.SMTPException, OSError) as exc:
        log.warning("user %s: the verification email was not sent: %s", user.pk, exc)
        return False
    return True


def email_verify(token: str) -> AbstractBaseUser:
    """The user whose current address ``token`` proves, now recorded as verified; ``VerificationFailed``
    naming why otherwise."""
    try:
        claim = signing.loads(token[:512], salt=_SALT, max_age=MAX_AGE_S)
    except signing.SignatureExpired:
        raise VerificationFailed("this link has expired: send a new one from the Billing page") from None
    except signing.BadSignature:
        raise VerificationFailed("this link is not one we sent (it may be cut short): send a new one") from None
    user = get_user_model().objects.filter(pk=claim.get("u")).first() if isinstance(claim, dict) else None
    if user is None or not user.email or user.email.lower() != claim.get("e"):
        raise VerificationFailed("this link is for an address the account no longer has: send a new one")
    try:
        with transaction.atomic():
            EmailVerification.objects.get_or_create(
                user=user, email=user.email.lower(), defaults={"verified_at": timezone.now()}
            )
    except IntegrityError:
        pass  # verified by a concurrent click on the same link
    return user
