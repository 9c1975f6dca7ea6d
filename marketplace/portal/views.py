"""Provider portal pages: signing up, the organisation's details, terms and team, and its cloud accounts.

Every page but signup and an invitation link needs a member of a provider organisation: anyone else gets 404,
as do another provider's accounts, members and invitations. A role short of an action gets 403.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.cache import patch_cache_control
from django.views.decorators.cache import never_cache
from django.views.decorators.debug import sensitive_post_parameters
from django.views.decorators.http import require_http_methods, require_POST

from ledger.receipts import receipt_for_buyer
from marketplace.catalog.price_falls import machine_moments
from marketplace.catalog.selectors import machine_reliability_shown
from marketplace.models import GpuModel, InvitationStatus, Membership, Order, OrganizationKind, ProviderState
from marketplace.orders.payouts import payout_statement, provider_earnings_to_date, provider_running_orders
from marketplace.portal import dashboard as board
from marketplace.portal import selectors
from marketplace.portal.clouds import CLOUDS, Cloud
from marketplace.portal.forms import (
    AccountForm,
    DetailsForm,
    InvitationSignupForm,
    InviteForm,
    MachineForm,
    MachinePriceFallForm,
    RoleForm,
    SignupForm,
    SlaCommitmentForm,
    TermsForm,
    rate_limit_text,
)
from marketplace.portal.price_falls import price_fall_view, rule_summary
from marketplace.portal.selectors import Permission, role_allows
from marketplace.portal.services import (
    TERMS_VERSION,
    PortalError,
    invitation_accept,
    invitation_signup,
    machine_listing_create,
    machine_price_fall_update,
    provider_account_save,
    provider_account_sync,
    provider_details_update,
    provider_profile_ensure,
    provider_signup,
    provider_terms_accept,
)
from marketplace.portal.team_actions import form_error, invitation_revoke_action, invite_action, member_update_action
from marketplace.sla.published import SELLER_CHOSEN
from marketplace.sla.selectors import provider_sla_rows
from marketplace.sla.services import CommitmentRefused, account_sla_commit, floor_pct
from marketplace.web.charts import gpu_hours_chart, telemetry_chart
from providers.community.selectors import (
    machines_latest_unverified,
    machines_utilization,
    provider_machine_get,
    provider_machines,
)
from providers.errors import ProviderError, TransientProviderError
from providers.models import ProviderAccount

AUTH_BACKEND = "django.contrib.auth.backends.ModelBackend"


def _membership(request: HttpRequest, permission: Permission = Permission.READ) -> Membership:
    membership = selectors.provider_membership(request.user)
    if membership is None:
        raise Http404("no provider organisation")
    if not role_allows(membership.role, permission):
        raise PermissionDenied(f"a {membership.role} cannot do this")
    if not hasattr(membership.organization, "provider_profile"):
        # An organisation made outside the signup (manage.py demo, the admin) has no profile yet.
        membership.organization.provider_profile = provider_profile_ensure(organization=membership.organization)
    return membership


def _page(request: HttpRequest, template: str, membership: Membership, tab: str, **context: Any) -> HttpResponse:
    organization = membership.organization
    context.update(
        membership=membership,
        organization=organization,
        profile=organization.provider_profile,
        tab=tab,
        can_accounts=role_allows(membership.role, Permission.ACCOUNTS),
        can_team=role_allows(membership.role, Permission.TEAM),
        can_details=role_allows(membership.role, Permission.DETAILS),
    )
    return render(request, template, context)


# --- Signing up -----------------------------------------------------------------------------------------------


@sensitive_post_parameters("password1", "password2")
@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if selectors.provider_membership(request.user) is not None:
        return redirect("portal:home")
    form = SignupForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        data = form.cleaned_data
        try:
            user = provider_signup(
                username=data["username"],
                email=data["email"],
                password=data["password1"],
                organization_name=data["organization_name"],
            )
        except PortalError as error:
            form_error(form, error)
        else:
            login(request, user, backend=AUTH_BACKEND)
            messages.success(request, f"Welcome, {data['organization_name']}. Next: your business details.")
            return redirect("portal:details")
    return render(request, "portal/signup.html", {"form": form})


@never_cache
@sensitive_post_parameters("password1", "password2")
@require_http_methods(["GET", "POST"])
def invitation(request: HttpRequest, token: str) -> HttpResponse:
    """An invitation link: sign up with the invited address, or accept while signed in with it."""
    found = selectors.invitation_by_token(token)
    if found is None:
        raise Http404("no such invitation")
    if found.organization.kind != OrganizationKind.PROVIDER:  # a buyer's link, opened at the portal's address
        return redirect("storefront:invitation", token=token)
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
                return render(request, "invitation.html", context)
        except PortalError as error:
            if form is not None:
                form_error(form, error)
            else:
                context["error"] = error.message
        else:
            messages.success(request, f"You joined {found.organization.name} as {found.get_role_display()}.")
            return redirect("portal:home")
    return render(request, "invitation.html", context)


# --- The organisation -----------------------------------------------------------------------------------------


@login_required
def home(request: HttpRequest) -> HttpResponse:
    membership = _membership(request)
    accounts = list(selectors.account_list(organization=membership.organization))
    return _page(
        request,
        "portal/home.html",
        membership,
        "home",
        accounts=accounts,
        terms_current=membership.organization.provider_profile.terms_version == TERMS_VERSION,
        verified=membership.organization.provider_profile.state == ProviderState.VERIFIED,
    )


@login_required
@require_http_methods(["GET", "POST"])
def details(request: HttpRequest) -> HttpResponse:
    membership = _membership(request, Permission.DETAILS if request.method == "POST" else Permission.READ)
    profile = membership.organization.provider_profile
    form = DetailsForm.for_profile(profile, request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        provider_details_update(organization=membership.organization, details=form.details())
        messages.success(request, "Business details saved.")
        return redirect("portal:home" if profile.terms_accepted else "portal:terms")
    return _page(request, "portal/details.html", membership, "details", form=form)


@login_required
@require_http_methods(["GET", "POST"])
def terms(request: HttpRequest) -> HttpResponse:
    membership = _membership(request, Permission.DETAILS if request.method == "POST" else Permission.READ)
    form = TermsForm(request.POST if request.method == "POST" else None)
    if form.is_bound and form.is_valid():
        try:
            accepted = provider_terms_accept(
                organization=membership.organization,
                user=request.user,  # type: ignore[arg-type]
                version=form.cleaned_data["version"],
            )
        except PortalError as error:
            form_error(form, error)
        else:
            if accepted:
                messages.success(request, f"Terms version {TERMS_VERSION} accepted.")
            return redirect("portal:home")
    return _page(request, "portal/terms.html", membership, "terms", form=form, terms_version=TERMS_VERSION)


@login_required
@require_http_methods(["GET", "POST"])
def team(request: HttpRequest) -> HttpResponse:
    """The team and its invitations; a POST invites someone and shows the link, once, on this response."""
    membership = _membership(request, Permission.TEAM if request.method == "POST" else Permission.READ)
    organization = membership.organization
    form = InviteForm(request.POST if request.method == "POST" else None)
    link = ""
    if form.is_bound and form.is_valid():
        link = invite_action(request, organization, form, "portal:invitation")
        if link:
            form = InviteForm()
    response = _page(
        request,
        "portal/team.html",
        membership,
        "team",
        form=form,
        link=link,
        members=[
            (m, RoleForm(initial={"role": m.role}, prefix=f"m{m.pk}"))
            for m in selectors.member_list(organization=organization)
        ],
        invitations=selectors.invitation_list(organization=organization),
    )
    if link:
        patch_cache_control(response, no_store=True)
    return response


@login_required
@require_POST
def invitation_revoke_view(request: HttpRequest, invitation_id: int) -> HttpResponse:
    membership = _membership(request, Permission.TEAM)
    invitation_revoke_action(request, membership.organization, invitation_id)
    return redirect("portal:team")


@login_required
@require_POST
def member_update(request: HttpRequest, membership_id: int) -> HttpResponse:
    membership = _membership(request, Permission.TEAM)
    member_update_action(request, membership.organization, membership_id, RoleForm)
    return redirect("portal:team")


# --- Cloud accounts -------------------------------------------------------------------------------------------


@login_required
def accounts(request: HttpRequest) -> HttpResponse:
    membership = _membership(request)
    rows = list(selectors.account_list(organization=membership.organization))
    return _page(
        request,
        "portal/accounts.html",
        membership,
        "accounts",
        accounts=rows,
        clouds=CLOUDS.values(),
        editable_kinds=list(CLOUDS),
        nodes=selectors.cluster_nodes(organization=membership.organization),
        sla_kinds=SELLER_CHOSEN,
        sla_floor=floor_pct(),
    )


def _account_save(
    request: HttpRequest, form: AccountForm, membership: Membership, cloud: Cloud, account: ProviderAccount | None
) -> HttpResponse | None:
    """Save a valid form through the service; None (and the errors on the form) when it refused."""
    try:
        saved = provider_account_save(
            organization=membership.organization, data=form.account_input(kind=cloud.kind), account=account
        )
    except PortalError as error:
        form_error(form, error)
        return None
    except ProviderError as error:
        what = "could not be reached" if isinstance(error, TransientProviderError) else "refused the credentials"
        form.add_error(None, f"{cloud.label} {what}; nothing was saved. {error}")
        return None
    sells = "it sells now" if saved.enabled else "it sells once your organisation is verified"
    messages.success(request, f"Account {saved.name} saved: the credentials check passed and {sells}.")
    return redirect("portal:accounts")


@sensitive_post_parameters()  # every field: an error report never carries credentials
@login_required
@require_http_methods(["GET", "POST"])
def account_connect(request: HttpRequest, kind: str) -> HttpResponse:
    membership = _membership(request, Permission.ACCOUNTS)
    cloud = CLOUDS.get(kind)
    if cloud is None:
        raise Http404("no such cloud")
    form = AccountForm(request.POST if request.method == "POST" else None, cloud=cloud)
    if form.is_bound and form.is_valid():
        done = _account_save(request, form, membership, cloud, None)
        if done is not None:
            return done
    return _page(request, "portal/account_form.html", membership, "accounts", form=form, cloud=cloud, account=None)


@sensitive_post_parameters()
@login_required
@require_http_methods(["GET", "POST"])
def account_edit(request: HttpRequest, account_id: int) -> HttpResponse:
    membership = _membership(request, Permission.ACCOUNTS)
    account = selectors.account_get(organization=membership.organization, account_id=account_id)
    cloud = CLOUDS.get(account.kind) if account is not None else None
    if account is None or cloud is None:
        raise Http404("no such account")
    keys = selectors.account_credential_keys(account)
    initial = {
        "name": account.name,
        "regions": ", ".join(account.regions),
        "endpoint_url": account.endpoint_url,
        **{spec.key: account.options.get(spec.key, "") for spec in cloud.all_options},
        "rate_limits": rate_limit_text(account.options),
    }
    form = AccountForm(
        request.POST if request.method == "POST" else None,
        cloud=cloud,
        editing=True,
        stored=keys or frozenset(),
        initial=initial,
    )
    if form.is_bound and form.is_valid():
        done = _account_save(request, form, membership, cloud, account)
        if done is not None:
            return done
    return _page(
        request,
        "portal/account_form.html",
        membership,
        "accounts",
        form=form,
        cloud=cloud,
        account=account,
        unreadable=keys is None,
    )


@login_required
@require_POST
def account_sync(request: HttpRequest, account_id: int) -> HttpResponse:
    membership = _membership(request, Permission.ACCOUNTS)
    account = selectors.account_get(organization=membership.organization, account_id=account_id)
    if account is None:
        raise Http404("no such account")
    try:
        provider_account_sync(account=account)
    except PortalError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Sync of {account.name} queued; its status updates when it finishes.")
    return redirect("portal:accounts")


@login_required
@require_POST
def account_sla(request: HttpRequest, account_id: int) -> HttpResponse:
    """Set a host or cluster account's committed availability (``sla.services.account_sla_commit``)."""
    membership = _membership(request, Permission.ACCOUNTS)
    account = selectors.account_get(organization=membership.organization, account_id=account_id)
    if account is None:
        raise Http404("no such account")
    form = SlaCommitmentForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"SLA of {account.name}: " + "; ".join(form.errors.get("sla_commitment_pct", [])))
        return redirect("portal:accounts")
    try:
        account_sla_commit(account=account, pct=form.cleaned_data["sla_commitment_pct"])
    except CommitmentRefused as refused:
        messages.error(request, f"SLA of {account.name}: {refused}")
    else:
        messages.success(
            request,
            f"{account.name} commits to {account.sla_commitment_pct} %; its offers say so after the sync queued now.",
        )
    return redirect("portal:accounts")


# --- Independent machines and earnings ----------------------------------------------------------------------


@login_required
def machines(request: HttpRequest) -> HttpResponse:
    """The provider's listed machines: state, agent, self-test, utilization over the last hour, price."""
    membership = _membership(request)
    now = timezone.now()
    since = now - dt.timedelta(hours=1)
    scores = machine_reliability_shown(now=now)
    listed = list(provider_machines(provider=membership.organization.provider))
    # Implausible heartbeats stay out of the chart; a flagged latest figure is shown only with why it is unverified.
    utilization = machines_utilization(machines=listed, since=since, plausible_only=True)
    unverified = machines_latest_unverified(machines=listed, since=since)
    rows = []
    for machine in listed:
        series = utilization.get(machine.pk, [])
        score = scores.get((machine.account_id, machine.name))
        latest = series[-1][1] if series else None
        flagged = unverified.get(machine.pk)
        chart = _utilization_chart(machine.name, series, since=since, until=now)
        latest_shown, why = (flagged[1], flagged[0]) if flagged else (latest, "")
        rows.append((machine, chart, latest_shown, score, why, rule_summary(machine.price_fall)))
    known = [score for _, _, _, score, _, _ in rows if score is not None]
    overall = sum(known) / len(known) if known else None
    return _page(request, "portal/machines.html", membership, "machines", machines=rows, reliability=overall)


@sensitive_post_parameters()
@login_required
@require_http_methods(["GET", "POST"])
def machine_new(request: HttpRequest) -> HttpResponse:
    """List a machine; the agent's key and secret are shown once, on the page that follows the listing."""
    membership = _membership(request, Permission.ACCOUNTS)
    models = list(GpuModel.objects.order_by("key").values_list("key", "memory_gb"))
    form = MachineForm(request.POST or None, gpu_models=models)
    if request.method == "POST" and form.is_valid():
        try:
            listed = machine_listing_create(
                organization=membership.organization, name=form.cleaned_data["name"], listing=form.listing()
            )
        except PortalError as exc:
            form_error(form, exc)
        else:
            response = _page(
                request, "portal/machine_listed.html", membership, "machines", machine=listed.machine,
                secret=listed.secret, broker_url=request.build_absolute_uri("/").rstrip("/"),
            )  # fmt: skip
            patch_cache_control(response, no_store=True)  # the secret must not linger in a cache
            return response
    return _page(request, "portal/machine_form.html", membership, "machines", form=form)


@login_required
@require_http_methods(["GET", "POST"])
def machine_prices(request: HttpRequest, machine_id: int) -> HttpResponse:
    """A machine's price falls: what they are, what they do to its prices, and (for those who may change
    accounts) the form to change them."""
    membership = _membership(request, Permission.ACCOUNTS if request.method == "POST" else Permission.READ)
    machine = provider_machine_get(provider=membership.organization.provider, machine_id=machine_id)
    if machine is None:
        raise Http404("no such machine")
    form = MachinePriceFallForm(
        request.POST if request.method == "POST" else None, initial=MachinePriceFallForm.initial_for(machine.price_fall)
    )
    if form.is_bound and form.is_valid():
        try:
            machine_price_fall_update(machine=machine, rule=form.rule())
        except PortalError as exc:
            form_error(form, exc)
        else:
            messages.success(request, f"{machine.name}: {rule_summary(machine.price_fall)}; its offers follow shortly.")
            return redirect("portal:machine-prices", machine_id=machine.pk)
    moment = machine_moments(machines=[machine], now=timezone.now())[machine.pk]
    return _page(
        request, "portal/machine_prices.html", membership, "machines", machine=machine, form=form,
        falls=price_fall_view(machine, moment),
    )  # fmt: skip


@login_required
def earnings(request: HttpRequest) -> HttpResponse:
    """Orders running on the provider's capacity, and the month's payout statement with the commission."""
    membership = _membership(request)
    provider = membership.organization.provider
    month = request.GET.get("month") or timezone.now().strftime("%Y-%m")
    try:
        statement = payout_statement(provider=provider, month=month)
    except ValueError as exc:
        raise Http404(str(exc)) from None
    return _page(
        request, "portal/earnings.html", membership, "earnings", statement=statement,
        running=provider_running_orders(provider=provider), to_date=provider_earnings_to_date(provider=provider),
    )  # fmt: skip


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """The business at a glance: GPUs rented and idle by hour, revenue by day, running leases, interruptible
    orders against each machine's minimum bid, and this month's payout statement."""
    membership = _membership(request)
    provider = membership.organization.provider
    now = timezone.now()
    week = board.provider_gpu_hours(provider=provider, now=now, hours=7 * 24)
    day = week[-24:]
    leases = board.provider_leases(provider=provider)
    statement = payout_statement(provider=provider, month=now.strftime("%Y-%m"))
    return _page(
        request, "portal/dashboard.html", membership, "dashboard", now=now, currency=board.CURRENCY,
        day=day, day_chart=_gpu_chart(day, "last 24 hours"), week_days=board.gpu_days(week),
        week_chart=_gpu_chart(week, "last 7 days"),
        revenue=board.provider_revenue_by_day(provider=provider, today=now.date(), days=14), leases=leases,
        bids=board.provider_machine_bids(provider=provider, leases=leases), statement=statement,
        slas=provider_sla_rows(provider=provider, now=now, floor=floor_pct()),
    )  # fmt: skip


def _gpu_chart(series: list[board.GpuHour], period: str) -> str:
    """The dashboard's chart of GPUs rented and idle per hour over ``period``."""
    return gpu_hours_chart([(hour.start, hour.rented, hour.idle) for hour in series], period=period)


def _utilization_chart(name: str, series: list[Any], *, since: dt.datetime, until: dt.datetime) -> str:
    """A machine row's small chart of its GPUs' mean utilization (``series`` of (moment, %)) since ``since``."""
    return telemetry_chart(
        series, title=f"GPU utilization of {name}, last hour", unit="%", label="%", since=since, until=until,
        small=True,
    )  # fmt: skip


@login_required
def order_receipt(request: HttpRequest, order_id: str) -> HttpResponse:
    """The ledger receipt (JSON) of an order that ran on the provider's capacity; any other is 404."""
    membership = _membership(request)
    order = Order.objects.filter(public_id=order_id, offer__account__provider=membership.organization.provider).first()
    if order is None:
        raise Http404("no such order on your capacity")
    return JsonResponse(receipt_for_buyer(f"order:{order.public_id}"))
