"""Writes of the provider portal: signing up, business details and terms, the team and its invitations, cloud
accounts, and marketplace staff's verification decisions. The team services (invitations, roles, removal) and
signing up serve buyer organisations too, each kind with its own roles (``ROLES``).

Each public function is one transaction. Refusals raise ``PortalError`` with the form field at fault; a failed
credentials check raises the provider's own ``ProviderError`` and writes nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.services import ledger_append, user_commitment
from marketplace.catalog.fanout import offers_sync_soon
from marketplace.models import (
    Invitation,
    InvitationStatus,
    Membership,
    Offer,
    OfferStatus,
    Organization,
    OrganizationKind,
    ProviderProfile,
    ProviderState,
    Role,
)
from marketplace.models.organizations import BUYER_ROLES, PROVIDER_ROLES
from marketplace.portal.selectors import token_hash
from providers.community.pricing import PriceFallRule
from providers.community.services import ListedMachine, MachineInvalid, machine_list, machine_price_fall_set
from providers.endpoints import EndpointRefused, account_endpoints_check
from providers.errors import ProviderError
from providers.models import Machine, Provider, ProviderAccount, ProviderKind
from providers.registry import build_adapter
from providers.secrets import SecretUnreadable
from providers.services import AccountInvalid, account_credentials_normalise, provider_account_connect
from providers.text import name_problem
from providers.types import Credentials

log = logging.getLogger(__name__)

# The provider terms a seller accepts (templates/portal/terms.html); a new text gets a new version.
TERMS_VERSION = "2026-12"
INVITATION_TTL = dt.timedelta(days=7)
# The roles each kind of organisation gives; invitations and role changes refuse any other.
ROLES: dict[str, tuple[Role, ...]] = {OrganizationKind.PROVIDER: PROVIDER_ROLES, OrganizationKind.BUYER: BUYER_ROLES}
# The connect check's limits: a form must answer quickly even when the endpoint is wrong or down.
CHECK_OPTIONS = {"connect_timeout": "5", "read_timeout": "10", "max_attempts": "2"}


class PortalError(Exception):
    """A refused request; ``field`` names the form field at fault, "" the whole form."""

    def __init__(self, message: str, *, field: str = ""):
        super().__init__(message)
        self.message = message
        self.field = field


def _readable(field: str, value: str, *, lines: bool = False) -> None:
    """Refuse (``PortalError`` on ``field``) a name other people read that holds control or invisible
    formatting characters, NUL or lone surrogates (``providers.text.name_problem``); with ``lines``, each line
    on its own (an address). The forms check the same; this keeps every other caller to it."""
    for line in value.split("\n") if lines else [value]:
        if problem := name_problem(line):
            raise PortalError(problem, field=field)


# --- Signing up -----------------------------------------------------------------------------------------------


def _signup_conflicts(*, username: str, organization_name: str = "") -> None:
    if get_user_model().objects.filter(username__iexact=username).exists():
        raise PortalError("that username is taken", field="username")
    if organization_name and (
        Organization.objects.filter(name__iexact=organization_name).exists()
        or Provider.objects.filter(name__iexact=organization_name).exists()
    ):
        raise PortalError("an organisation of that name is already on the marketplace", field="organization_name")


def provider_signup(*, username: str, email: str, password: str, organization_name: str) -> AbstractBaseUser:
    """Create a provider organisation and its first person: the user, the ``Provider``, the ``Organization``
    (kind provider) with its ``ProviderProfile`` (pending) and the owner ``Membership``.

    Raises ``PortalError`` (field ``username`` or ``organization_name``) when either is taken, also when a
    concurrent signup took it between the check and the insert.
    """
    user, _ = _signup(OrganizationKind.PROVIDER, username, email, password, organization_name)
    return user


def buyer_signup(
    *, username: str, email: str, password: str, organization_name: str
) -> tuple[AbstractBaseUser, Organization]:
    """Create a buyer organisation and its first owner. Raises ``PortalError`` (field ``username`` or
    ``organization_name``) when either is taken, also when a concurrent signup took it meanwhile."""
    return _signup(OrganizationKind.BUYER, username, email, password, organization_name)


def _signup(
    kind: str, username: str, email: str, password: str, organization_name: str
) -> tuple[AbstractBaseUser, Organization]:
    email = email.lower()
    _readable("username", username)
    _readable("organization_name", organization_name)
    try:
        with transaction.atomic():
            _signup_conflicts(username=username, organization_name=organization_name)
            user = get_user_model().objects.create_user(username=username, email=email, password=password)
            provider = Provider.objects.create(name=organization_name) if kind == OrganizationKind.PROVIDER else None
            organization = Organization.objects.create(name=organization_name, kind=kind, provider=provider)
            if provider is not None:
                ProviderProfile.objects.create(organization=organization, contact_email=email)
            Membership.objects.create(user=user, organization=organization, role=Role.OWNER)
            _team_ledger("team.created", organization, owner=user_commitment(user))
    except IntegrityError:
        # A concurrent signup won the unique name: say which, outside the rolled-back transaction.
        _signup_conflicts(username=username, organization_name=organization_name)
        raise
    log.info("%s organisation %s signed up", kind, organization.pk)
    return user, organization


# Why a profile was made for a provider organisation that predates the portal (or was made by another path,
# like ``manage.py demo``): the same words as migration 0012's.
GRANDFATHERED_REASON = "selling before provider verification existed"


def provider_profile_ensure(*, organization: Organization) -> ProviderProfile:
    """The organisation's profile, made now if it has none: verified when its provider already has an enabled
    account (it sells: changing that is staff's decision, not a page view's), pending otherwise. Idempotent."""
    selling = ProviderAccount.objects.filter(provider_id=organization.provider_id, enabled=True).exists()
    profile, created = ProviderProfile.objects.get_or_create(
        organization=organization,
        defaults={
            "state": ProviderState.VERIFIED if selling else ProviderState.PENDING,
            "state_reason": GRANDFATHERED_REASON if selling else "",
        },
    )
    if created:
        log.info("made a %s profile for provider organisation %s", profile.state, organization.pk)
    return profile


# --- Details and terms ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BusinessDetails:
    legal_name: str
    country: str
    registered_address: str
    tax_id: str
    contact_email: str


def provider_details_update(*, organization: Organization, details: BusinessDetails) -> None:
    """Replace the organisation's business details. Idempotent. Raises ``PortalError`` for a legal name or
    address line that is not readable text (``_readable``)."""
    _readable("legal_name", details.legal_name)
    _readable("registered_address", details.registered_address, lines=True)
    _readable("tax_id", details.tax_id)
    ProviderProfile.objects.filter(organization=organization).update(
        legal_name=details.legal_name,
        country=details.country,
        registered_address=details.registered_address,
        tax_id=details.tax_id,
        contact_email=details.contact_email,
        details_updated_at=timezone.now(),
    )


def provider_terms_accept(*, organization: Organization, user: AbstractBaseUser, version: str) -> bool:
    """Record that ``user`` accepted the terms ``version`` for the organisation, now. Returns False when that
    version was already accepted (the first acceptance stays on record). Raises ``PortalError`` when
    ``version`` is not the current text (it changed while the page was open)."""
    if version != TERMS_VERSION:
        raise PortalError("the terms changed while the page was open: read the current version", field="accept")
    accepted = (
        ProviderProfile.objects.filter(organization=organization)
        .exclude(terms_version=version)
        .update(terms_version=version, terms_accepted_at=timezone.now(), terms_accepted_by=user)
    )
    return accepted == 1


# --- The team -------------------------------------------------------------------------------------------------


def _check_role(organization: Organization, role: str) -> None:
    roles = ROLES.get(organization.kind, ())
    if role not in roles:
        raise PortalError(f"choose one of {', '.join(roles)}", field="role")


def invitation_create(
    *, organization: Organization, email: str, role: str, by: AbstractBaseUser
) -> tuple[Invitation, str]:
    """Invite ``email`` to the organisation with ``role``; returns the invitation and the link's token, which is
    not stored (only its hash) and so can be shown only now. An open invitation to the same address is
    revoked. Raises ``PortalError`` for a role the organisation's kind does not give or an address already a
    member."""
    email = email.strip().lower()
    _check_role(organization, role)
    if Membership.objects.filter(organization=organization, user__email__iexact=email).exists():
        raise PortalError("someone with this address is already in the team", field="email")
    token = secrets.token_urlsafe(32)
    now = timezone.now()
    try:
        with transaction.atomic():
            Invitation.objects.filter(
                organization=organization, email=email, accepted_at__isnull=True, revoked_at__isnull=True
            ).update(revoked_at=now)
            invitation = Invitation.objects.create(
                organization=organization,
                email=email,
                role=role,
                token_hash=token_hash(token),
                invited_by=by,
                created_at=now,
                expires_at=now + INVITATION_TTL,
            )
    except IntegrityError:
        raise PortalError("this address was invited at the same moment; try again", field="email") from None
    return invitation, token


def invitation_revoke(*, invitation: Invitation) -> bool:
    """Revoke an open invitation; False when it was already accepted or revoked."""
    return (
        Invitation.objects.filter(pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        == 1
    )


def _invitation_claim(invitation: Invitation, user: AbstractBaseUser) -> Membership:
    """Inside the caller's transaction: turn an open invitation into ``user``'s membership."""
    now = timezone.now()
    status = invitation.status(now=now)
    if status != InvitationStatus.OPEN:
        raise PortalError(f"this invitation is {status.label}; ask for a new one")
    email = (getattr(user, "email", "") or "").lower()
    if email != invitation.email:
        raise PortalError(f"this invitation is for {invitation.email}; sign in with the account of that address")
    if Membership.objects.filter(user=user, organization=invitation.organization).exists():
        raise PortalError(f"you are already in {invitation.organization.name}")
    # A person may be in several buyer organisations but in one provider at most (a seller's console is
    # per provider).
    if (
        invitation.organization.kind == OrganizationKind.PROVIDER
        and Membership.objects.filter(user=user, organization__kind=OrganizationKind.PROVIDER).exists()
    ):
        raise PortalError("you are already in another provider organisation")
    # Claim the invitation before using it: a second tab accepting at once finds it taken.
    claimed = Invitation.objects.filter(
        pk=invitation.pk, accepted_at__isnull=True, revoked_at__isnull=True, expires_at__gt=now
    ).update(accepted_at=now, accepted_by=user)
    if claimed != 1:
        raise PortalError("this invitation was just used or revoked")
    joined = Membership.objects.create(user=user, organization=invitation.organization, role=invitation.role)
    inviter = user_commitment(invitation.invited_by) if invitation.invited_by else None
    _team_ledger("team.joined", invitation.organization, member=user_commitment(user), role=joined.role,
                 invited_by=inviter)  # fmt: skip
    return joined


def invitation_accept(*, invitation: Invitation, user: AbstractBaseUser) -> Membership:
    """``user`` (signed in, with the invited address) joins the team with the invited role. Raises
    ``PortalError`` for an invitation no longer open, another address, someone already in the organisation,
    or (for a provider) someone already in another provider."""
    with transaction.atomic():
        return _invitation_claim(invitation, user)


def invitation_signup(*, invitation: Invitation, username: str, password: str) -> AbstractBaseUser:
    """Create a user with the invited address and accept the invitation for them, in one transaction."""
    _readable("username", username)
    try:
        with transaction.atomic():
            _signup_conflicts(username=username)
            user = get_user_model().objects.create_user(username=username, email=invitation.email, password=password)
            _invitation_claim(invitation, user)
    except IntegrityError:
        _signup_conflicts(username=username)
        raise
    return user


def _refuse_ownerless(organization: Organization, *, changing: int, new_role: str | None) -> None:
    """Lock the team (in pk order) and refuse a change of member ``changing`` to ``new_role`` (None: removed)
    that would leave the organisation without an owner."""
    members = list(Membership.objects.select_for_update().filter(organization=organization).order_by("pk"))
    owners = sum(1 for m in members if (new_role if m.pk == changing else m.role) == Role.OWNER)
    if owners == 0:
        raise PortalError("the organisation needs at least one owner")


def membership_role_set(*, membership: Membership, role: str, by: AbstractBaseUser | None = None) -> None:
    """Give a member another of the organisation kind's roles; the last owner keeps theirs. Ledgered, with
    ``by`` (who decided; None for the system) as a commitment."""
    _check_role(membership.organization, role)
    with transaction.atomic():
        _refuse_ownerless(membership.organization, changing=membership.pk, new_role=role)
        previous = Membership.objects.select_for_update().get(pk=membership.pk).role
        if previous == role:
            return
        Membership.objects.filter(pk=membership.pk).update(role=role)
        _team_ledger("team.role_changed", membership.organization, member=user_commitment(membership.user),
                     **{"from": previous, "to": role}, by=_decider(by))  # fmt: skip


def membership_remove(*, membership: Membership, by: AbstractBaseUser | None = None) -> None:
    """Take someone off the team, or (``by`` the member themself) leave it; the last owner stays. Their API
    tokens for the organisation stop working at once (``ScopedTokenAuthentication``). Ledgered."""
    with transaction.atomic():
        _refuse_ownerless(membership.organization, changing=membership.pk, new_role=None)
        removed = Membership.objects.filter(pk=membership.pk).delete()[0]
        if not removed:
            return
        left = by is not None and by.pk == membership.user_id
        _team_ledger("team.left" if left else "team.removed", membership.organization,
                     member=user_commitment(membership.user), role=membership.role, by=_decider(by))  # fmt: skip


def _decider(user: AbstractBaseUser | None) -> str | None:
    return user_commitment(user) if user is not None else None


def _team_ledger(kind: str, organization: Organization, **facts: Any) -> None:
    """Ledger a change to who may act for ``organization`` (people only as commitments: erasable)."""
    ledger_append(kind=kind, subject=f"organization:{organization.pk}",
                  payload={"organization": organization.pk, **facts})  # fmt: skip


# --- Cloud accounts -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccountInput:
    """A cloud account as the connect form gives it. Empty credential values keep what is stored; the keys in
    ``clear`` remove a stored optional credential. ``managed_options`` are the option keys the form shows:
    those absent from ``options`` are removed, any other stored option is kept."""

    kind: str
    name: str
    regions: list[str]
    endpoint_url: str = ""
    credentials: dict[str, str] = field(default_factory=dict)
    clear: frozenset[str] = frozenset()
    options: dict[str, str] = field(default_factory=dict)
    managed_options: frozenset[str] = frozenset()
    required_credentials: frozenset[str] = frozenset()


def _stored_credentials(account: ProviderAccount | None) -> dict[str, str]:
    if account is None:
        return {}
    try:
        return dict(account.credentials().values)
    except SecretUnreadable:
        return {}  # no key reads them any more: the seller enters them again


def provider_account_save(
    *, organization: Organization, data: AccountInput, account: ProviderAccount | None = None
) -> ProviderAccount:
    """Connect a new cloud account (``account`` None) or change one of the organisation's provider's accounts.

    First a cheap real read through the cloud's adapter, with short timeouts, proves the credentials; only then
    is the account written (credentials encrypted), so a refused check leaves nothing behind. The account
    sells (``enabled``) only while the provider is verified.

    Raises the provider's ``ProviderError`` (``CredentialsRejected``, ``TransientProviderError``, ...) when the
    check fails, and ``PortalError`` for settings the adapter refuses or a name already used.
    """
    if account is not None and (account.kind != data.kind or account.provider_id != organization.provider_id):
        raise PortalError("this account belongs to another cloud or provider")
    _readable("name", data.name)
    values = {k: v for k, v in _stored_credentials(account).items() if k not in data.clear}
    values.update({k: v for k, v in data.credentials.items() if v})
    for key in sorted(data.required_credentials):
        if not values.get(key):
            raise PortalError("this field is required", field=key)
    options = {k: v for k, v in (account.options if account else {}).items() if k not in data.managed_options}
    options.update({k: v for k, v in data.options.items() if v})
    taken = ProviderAccount.objects.filter(provider_id=organization.provider_id, name=data.name)
    if account is None and taken.exists():
        raise PortalError("you already have an account of that name", field="name")

    try:
        values, endpoint_url = account_credentials_normalise(data.kind, values, data.endpoint_url)
    except AccountInvalid as exc:
        raise PortalError(str(exc).removeprefix("kubeconfig: "), field="kubeconfig") from None
    if data.kind == ProviderKind.KUBERNETES and not values.get("token"):
        raise PortalError("give the service account's token, or paste a kubeconfig", field="token")
    credentials = Credentials(kind=data.kind, values=values, endpoint_url=endpoint_url or None)
    try:
        account_endpoints_check(credentials, options)
    except EndpointRefused as exc:
        raise PortalError(exc.message, field=exc.field) from None
    try:
        adapter = build_adapter(data.kind, credentials, data.regions, {**options, **CHECK_OPTIONS})
    except ValueError as exc:
        key = str(exc).partition(":")[0].removeprefix("options.")
        raise PortalError(str(exc), field=key if key in data.managed_options else "") from None
    try:
        adapter.check_credentials()
    except ProviderError as exc:
        # The error's class and code only: a provider's message is shown to the seller, not logged.
        log.info(
            "credentials check refused for provider %s (%s): %s %s",
            organization.provider_id,
            data.kind,
            type(exc).__name__,
            exc.code,
        )
        raise

    with transaction.atomic():
        # The profile row orders this against a verification or suspension deciding ``enabled``.
        profile = ProviderProfile.objects.select_for_update().get(organization=organization)
        provider = Provider.objects.get(pk=organization.provider_id)
        if account is None and ProviderAccount.objects.filter(provider=provider, name=data.name).exists():
            raise PortalError("you already have an account of that name", field="name")
        was_enabled = account is not None and ProviderAccount.objects.filter(pk=account.pk, enabled=True).exists()
        try:
            saved = provider_account_connect(
                provider_name=provider.name,
                kind=data.kind,
                name=account.name if account else data.name,
                credentials=values,
                regions=data.regions,
                endpoint_url=endpoint_url,
                options=options,
            )
        except AccountInvalid as exc:
            name, _, message = str(exc).partition(": ")
            raise PortalError(message or str(exc), field=name) from None
        # A new account sells if the provider is verified; an edit never turns selling on for an account staff
        # turned off (``provider_account_connect`` itself always enables).
        enabled = profile.state == ProviderState.VERIFIED and (account is None or was_enabled)
        ProviderAccount.objects.filter(pk=saved.pk).update(enabled=enabled)
        saved.enabled = enabled
    log.info("provider %s saved %s account %s", organization.provider_id, data.kind, saved.pk)
    return saved


def provider_account_sync(*, account: ProviderAccount) -> None:
    """Queue a sync of the account's offers now, rather than at the next scheduled sync. Raises
    ``PortalError`` for an account that does not sell (its provider is not verified)."""
    if not account.enabled:
        raise PortalError("this account syncs once your organisation is verified")
    offers_sync_soon(account_ids=[account.pk])


# --- Verification (marketplace staff) -------------------------------------------------------------------------


def provider_state_change(*, profile_id: int, to: str, reason: str, by: AbstractBaseUser) -> ProviderProfile:
    """Verify or suspend a provider, as marketplace staff decided for ``reason``.

    Follows ``ProviderProfile.TRANSITIONS``; verifying needs complete business details and accepted terms.
    Claims the profile with a conditional update on its previous state, enables (verified) or disables
    (suspended) every account of the provider, takes a suspended provider's offers off sale, and ledgers
    ``provider.verified`` / ``provider.suspended`` in the same transaction, the decider as a personal-data
    commitment. A verification queues a sync of each account after commit. Raises ``PortalError``.
    """
    reason = reason.strip()
    if not reason:
        raise PortalError("give a reason", field="reason")
    with transaction.atomic():
        profile = ProviderProfile.objects.select_for_update().select_related("organization").get(pk=profile_id)
        organization = profile.organization
        previous = profile.state
        if to not in ProviderProfile.TRANSITIONS.get(previous, frozenset()):
            raise PortalError(f"{organization.name} is {previous}: it cannot become {to}")
        if to == ProviderState.VERIFIED and not (profile.details_complete and profile.terms_accepted):
            raise PortalError(f"{organization.name} has not completed its business details and accepted the terms")
        now = timezone.now()
        claimed = ProviderProfile.objects.filter(pk=profile.pk, state=previous).update(
            state=to, state_reason=reason, state_changed_at=now
        )
        if claimed != 1:
            raise PortalError(f"{organization.name} changed state meanwhile; look again")
        accounts = ProviderAccount.objects.filter(provider_id=organization.provider_id)
        account_ids = list(accounts.order_by("pk").values_list("pk", flat=True))
        accounts.update(enabled=to == ProviderState.VERIFIED)
        withdrawn = 0
        if to == ProviderState.SUSPENDED:
            # Stale offers leave the storefront and the offer book at once, not at the next sync.
            withdrawn = Offer.objects.filter(account_id__in=account_ids, status=OfferStatus.AVAILABLE).update(
                status=OfferStatus.STALE
            )
        ledger_append(
            kind=f"provider.{to}",
            subject=f"provider:{organization.provider_id}",
            payload={
                "provider": organization.provider_id,
                "organization": organization.pk,
                "from": previous,
                "to": to,
                "reason": reason,
                "accounts": account_ids,
                "offers_withdrawn": withdrawn,
                "by": user_commitment(by),
            },
        )
        if to == ProviderState.VERIFIED:
            offers_sync_soon(account_ids=account_ids)
    profile.refresh_from_db()
    log.info("provider %s: %s -> %s", organization.provider_id, previous, to)
    return profile


# --- Independent machines -----------------------------------------------------------------------------------


def machine_listing_create(*, organization: Organization, name: str, listing: dict[str, Any]) -> ListedMachine:
    """List a machine for the organisation's provider, on its independent-machines (``community``) account,
    which is made on first use and sells, like any account, only while the provider is verified. Returns the
    machine with its agent secret, to be shown once. Raises ``PortalError`` naming the field."""
    with transaction.atomic():
        profile = ProviderProfile.objects.select_for_update().get(organization=organization)
        provider = Provider.objects.get(pk=organization.provider_id)
        account = ProviderAccount.objects.filter(provider=provider, kind=ProviderKind.COMMUNITY).first()
        if account is None:
            account = provider_account_connect(
                provider_name=provider.name, kind=ProviderKind.COMMUNITY, name="independent-machines",
                credentials={}, regions=[listing["region"]],
            )  # fmt: skip
            account.enabled = profile.state == ProviderState.VERIFIED
            account.save(update_fields=["enabled"])
        if listing["region"] not in account.regions:
            account.regions = [*account.regions, listing["region"]]
            account.save(update_fields=["regions"])
        try:
            return machine_list(account=account, name=name, listing=listing)
        except MachineInvalid as exc:
            field, _, message = str(exc).partition(": ")
            raise PortalError(message or str(exc), field=field) from None


def machine_price_fall_update(*, machine: Machine, rule: PriceFallRule) -> Machine:
    """Store the price falls the seller accepts for its ``machine`` (the caller checked it is theirs) and ask
    for its account's offers to be built again, so they carry the new prices within moments rather than at the
    next round. Raises ``PortalError`` naming the field; nothing is stored then."""
    with transaction.atomic():
        try:
            machine = machine_price_fall_set(machine=machine, rule=rule)
        except MachineInvalid as exc:
            field, _, message = str(exc).partition(": ")
            raise PortalError(message or str(exc), field=field) from None
        offers_sync_soon(account_ids=[machine.account_id])
    return machine
