"""Connecting cloud accounts: a real credentials check through the adapter (the AWS sandbox), encrypted storage,
the provider's own error on the form with nothing saved, secrets never shown or logged, and sync now."""

from __future__ import annotations

import html
import json
import logging

import pytest

from ledger.models import LedgerEntry
from marketplace.models import Offer, OfferStatus, ProviderProfile, ProviderState
from marketplace.portal.clouds import CLOUDS
from providers.models import ProviderAccount, SyncStatus
from sandboxes import DEMO_REGIONS
from tests.conftest import AWS_TEST_CREDENTIALS, TENCENT_TEST_CREDENTIALS
from tests.factories import ProviderAccountFactory
from tests.portal.conftest import client_for

pytestmark = pytest.mark.django_db

SECRET = AWS_TEST_CREDENTIALS["secret_access_key"]
KEY_ID = AWS_TEST_CREDENTIALS["access_key_id"]
REFUSED = "AWS was not able to validate the provided access credentials"


def _form(sandbox, **changes):
    return {
        "name": "main",
        "regions": "us-east-1, eu-west-1",
        "endpoint_url": sandbox.url,
        "access_key_id": KEY_ID,
        "secret_access_key": SECRET,
        **changes,
    }


def _all_logged(caplog) -> str:
    return "\n".join(f"{r.getMessage()} {r.args!r} {r.__dict__!r}" for r in caplog.records)


def test_an_owner_connects_an_aws_account_checked_and_stored_encrypted(petra, petra_org, aws_sandbox):
    response = client_for(petra).post("/provider/accounts/connect/aws", _form(aws_sandbox))

    assert response.status_code == 302, response.context["form"].errors
    account = ProviderAccount.objects.get()
    assert (account.provider_id, account.kind, account.name, account.regions, account.endpoint_url) == (
        petra_org.provider_id,
        "aws",
        "main",
        ["us-east-1", "eu-west-1"],
        aws_sandbox.url,
    )
    assert account.credentials().values == AWS_TEST_CREDENTIALS
    assert SECRET not in account.credentials_encrypted
    assert KEY_ID not in account.credentials_encrypted
    # The check's short timeouts are for the check only; pending providers do not sell yet.
    assert account.options == {}
    assert account.enabled is False


def test_an_operator_connects_and_a_verified_providers_account_sells_at_once(olga, ready, aws_sandbox):
    ProviderProfile.objects.filter(pk=ready.pk).update(state=ProviderState.VERIFIED)

    response = client_for(olga).post(
        "/provider/accounts/connect/aws", _form(aws_sandbox, connect_timeout="3", max_attempts="4")
    )

    assert response.status_code == 302
    account = ProviderAccount.objects.get()
    assert account.enabled is True
    assert account.options == {"connect_timeout": "3", "max_attempts": "4"}


def test_rejected_credentials_show_the_providers_error_on_the_form_and_save_nothing(petra, aws_sandbox, caplog):
    caplog.set_level(logging.DEBUG)
    aws_sandbox.faults.inject("credentials", action="DescribeAvailabilityZones")
    entries = LedgerEntry.objects.count()

    response = client_for(petra).post("/provider/accounts/connect/aws", _form(aws_sandbox))

    assert response.status_code == 200
    (error,) = response.context["form"].non_field_errors()
    assert REFUSED in error
    assert "AuthFailure" in error
    page = response.content.decode()
    assert html.escape(REFUSED) in page
    assert "nothing was saved" in page
    assert not ProviderAccount.objects.exists()
    assert LedgerEntry.objects.count() == entries
    # The refused form does not echo the secret, and no log line carries it.
    assert SECRET not in page
    assert caplog.records, "the refusal is logged (without the secret)"
    assert SECRET not in _all_logged(caplog)


def test_an_unreachable_endpoint_is_reported_quickly_and_saves_nothing(petra):
    response = client_for(petra).post(
        "/provider/accounts/connect/aws", _form(type("S", (), {"url": "http://127.0.0.1:9"})())
    )

    (error,) = response.context["form"].non_field_errors()
    assert error.startswith("Amazon Web Services could not be reached; nothing was saved.")
    assert not ProviderAccount.objects.exists()


def test_secrets_appear_in_no_log_record_while_connecting(petra, aws_sandbox, caplog):
    caplog.set_level(logging.DEBUG)

    client_for(petra).post("/provider/accounts/connect/aws", _form(aws_sandbox))

    assert ProviderAccount.objects.count() == 1
    assert caplog.records
    assert SECRET not in _all_logged(caplog)


def test_secrets_are_never_rendered_again(petra, aws_sandbox):
    client = client_for(petra)
    client.post("/provider/accounts/connect/aws", _form(aws_sandbox, session_token="petra-session-token"))
    account = ProviderAccount.objects.get()

    listing = client.get("/provider/accounts").content.decode()
    edit = client.get(f"/provider/accounts/{account.pk}/edit").content.decode()
    home = client.get("/provider/").content.decode()

    for page in (listing, edit, home):
        for value in (SECRET, KEY_ID, "petra-session-token", account.credentials_encrypted):
            assert value not in page
    assert "main" in listing
    assert "us-east-1, eu-west-1" in listing
    # The edit form says which fields are set, not what they hold.
    assert edit.count('class="setflag set"') == 3


def test_editing_keeps_the_stored_secret_when_left_empty_and_rechecks(petra, aws_sandbox):
    client = client_for(petra)
    client.post("/provider/accounts/connect/aws", _form(aws_sandbox))
    account = ProviderAccount.objects.get()

    response = client.post(
        f"/provider/accounts/{account.pk}/edit",
        _form(
            aws_sandbox, name="renamed", regions="us-west-2", access_key_id="", secret_access_key="", image_id="ami-1"
        ),
    )

    assert response.status_code == 302, response.context["form"].errors
    account.refresh_from_db()
    assert (account.name, account.regions, account.options) == ("main", ["us-west-2"], {"image_id": "ami-1"})
    assert account.credentials().values == AWS_TEST_CREDENTIALS


def test_an_optional_credential_is_removed_with_its_box(petra, aws_sandbox):
    client = client_for(petra)
    client.post("/provider/accounts/connect/aws", _form(aws_sandbox, session_token="petra-session-token"))
    account = ProviderAccount.objects.get()
    assert 'name="clear_session_token"' in client.get(f"/provider/accounts/{account.pk}/edit").content.decode()

    response = client.post(
        f"/provider/accounts/{account.pk}/edit",
        _form(aws_sandbox, access_key_id="", secret_access_key="", clear_session_token="on"),
    )

    assert response.status_code == 302, response.context["form"].errors
    assert ProviderAccount.objects.get().credentials().values == AWS_TEST_CREDENTIALS


def test_a_new_account_form_has_no_remove_boxes(petra):
    page = client_for(petra).get("/provider/accounts/connect/aws").content.decode()

    assert "clear_" not in page


def test_a_failed_recheck_on_edit_leaves_the_account_as_it_was(petra, aws_sandbox):
    client = client_for(petra)
    client.post("/provider/accounts/connect/aws", _form(aws_sandbox))
    account = ProviderAccount.objects.get()
    before = (account.credentials_encrypted, account.regions)

    response = client.post(
        f"/provider/accounts/{account.pk}/edit", _form(aws_sandbox, access_key_id="bad-key", regions="us-west-2")
    )

    assert REFUSED in response.context["form"].non_field_errors()[0]
    account.refresh_from_db()
    assert (account.credentials_encrypted, account.regions) == before


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"regions": ""}, "regions", "This field is required."),
        ({"regions": " , "}, "regions", "name at least one region"),
        ({"regions": "us-east-1, Mars Base"}, "regions", "not Amazon Web Services region names: “mars”, “base”"),
        ({"regions": "eastus"}, "regions", "not Amazon Web Services region names: “eastus”"),
        ({"endpoint_url": "ftp://example.com"}, "endpoint_url", "Enter a valid URL."),
        ({"secret_access_key": ""}, "secret_access_key", "This field is required."),
        ({"name": "my account!"}, "name", "letters, digits, dots, dashes and underscores"),
        ({"connect_timeout": "soon"}, "connect_timeout", "enter a number"),
        ({"max_attempts": "2.5"}, "max_attempts", "enter a whole number"),
        ({"read_timeout": "0"}, "read_timeout", "at least 0.1"),
    ],
)
def test_bad_account_input_shows_the_field_error_and_calls_no_provider(petra, changes, field, message, aws_sandbox):
    aws_sandbox.faults.inject("credentials", action=None)  # a call to the provider would fail differently

    response = client_for(petra).post("/provider/accounts/connect/aws", _form(aws_sandbox, **changes))

    assert response.status_code == 200
    assert any(message in e for e in response.context["form"].errors[field]), response.context["form"].errors
    assert not response.context["form"].non_field_errors()
    assert not ProviderAccount.objects.exists()


def test_a_second_account_of_the_same_name_is_refused(petra, aws_sandbox):
    client = client_for(petra)
    client.post("/provider/accounts/connect/aws", _form(aws_sandbox))

    response = client.post("/provider/accounts/connect/aws", _form(aws_sandbox, regions="us-west-2"))

    assert response.context["form"].errors["name"] == ["you already have an account of that name"]
    assert ProviderAccount.objects.get().regions == ["us-east-1", "eu-west-1"]


def test_a_gcp_key_that_is_not_a_service_account_key_is_a_field_error(petra):
    response = client_for(petra).post(
        "/provider/accounts/connect/gcp",
        {"name": "g", "regions": "us-central1", "service_account_json": json.dumps({"type": "user"})},
    )

    assert response.context["form"].errors["service_account_json"] == [
        'this is not a service-account key (its "type" must be "service_account")'
    ]
    assert "&quot;type&quot;: &quot;user&quot;" not in response.content.decode()


@pytest.mark.parametrize("kind", sorted(CLOUDS))
def test_every_sandbox_region_is_a_well_formed_region_name(kind):
    assert all(CLOUDS[kind].region_pattern.fullmatch(r) for r in DEMO_REGIONS[kind])


@pytest.mark.parametrize("kind", sorted(CLOUDS))
def test_each_cloud_has_a_connect_form_with_its_credentials(petra, kind):
    page = client_for(petra).get(f"/provider/accounts/connect/{kind}").content.decode()

    for spec in CLOUDS[kind].credentials:
        assert f'name="{spec.key}"' in page


def test_an_unknown_cloud_is_404(petra):
    assert client_for(petra).get("/provider/accounts/connect/community").status_code == 404


# --- Tenancy ---------------------------------------------------------------------------------------------------


def test_another_providers_accounts_are_invisible(petra, quentin, aws_sandbox):
    client_for(petra).post("/provider/accounts/connect/aws", _form(aws_sandbox))
    account = ProviderAccount.objects.get()
    client = client_for(quentin)

    assert client.get(f"/provider/accounts/{account.pk}/edit").status_code == 404
    assert client.post(f"/provider/accounts/{account.pk}/edit", _form(aws_sandbox)).status_code == 404
    assert client.post(f"/provider/accounts/{account.pk}/sync").status_code == 404
    assert "No cloud accounts yet." in client.get("/provider/accounts").content.decode()


def test_buyers_get_404_on_account_pages(alice, petra_org):
    account = ProviderAccountFactory(provider=petra_org.provider)
    client = client_for(alice)

    assert client.get(f"/provider/accounts/{account.pk}/edit").status_code == 404
    assert client.post(f"/provider/accounts/{account.pk}/sync").status_code == 404
    assert client.get("/provider/accounts/connect/aws").status_code == 404


def test_viewers_cannot_edit_or_sync(victor, petra_org):
    account = ProviderAccountFactory(provider=petra_org.provider)
    client = client_for(victor)

    assert client.get(f"/provider/accounts/{account.pk}/edit").status_code == 403
    assert client.post(f"/provider/accounts/{account.pk}/sync").status_code == 403


# --- Sync now --------------------------------------------------------------------------------------------------


def test_sync_now_queues_the_accounts_sync_and_the_page_shows_its_status(
    olga, ready, aws_sandbox, alice, django_capture_on_commit_callbacks
):
    ProviderProfile.objects.filter(pk=ready.pk).update(state=ProviderState.VERIFIED)
    client = client_for(olga)
    client.post("/provider/accounts/connect/aws", _form(aws_sandbox))
    account = ProviderAccount.objects.get()

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = client.post(f"/provider/accounts/{account.pk}/sync")

    assert response.status_code == 302
    assert len(callbacks) == 1
    account.refresh_from_db()
    assert account.sync_status == SyncStatus.OK
    assert Offer.objects.filter(account=account, status=OfferStatus.AVAILABLE).exists()
    page = client.get("/provider/accounts").content.decode()
    assert "enabled" in page
    assert '<span class="sync ok">ok</span>' in page
    # The offers are on sale, and the API that lists them carries nothing of the credentials.
    api = client_for(alice).get("/api/v1/offers?region=us-east-1")
    assert api.status_code == 200
    assert api.json()
    assert SECRET not in api.content.decode()
    assert KEY_ID not in api.content.decode()


def test_a_failed_sync_shows_its_error_on_the_accounts_page(
    olga, ready, aws_sandbox, django_capture_on_commit_callbacks
):
    ProviderProfile.objects.filter(pk=ready.pk).update(state=ProviderState.VERIFIED)
    client = client_for(olga)
    client.post("/provider/accounts/connect/aws", _form(aws_sandbox))
    account = ProviderAccount.objects.get()
    aws_sandbox.faults.inject("credentials", action=None)

    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/provider/accounts/{account.pk}/sync")

    page = client.get("/provider/accounts").content.decode()
    assert '<span class="sync failed">failed</span>' in page
    assert html.escape(REFUSED) in page


def test_a_pending_providers_account_cannot_sync(petra, petra_org, django_capture_on_commit_callbacks):
    account = ProviderAccountFactory(provider=petra_org.provider, enabled=False)

    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client_for(petra).post(f"/provider/accounts/{account.pk}/sync", follow=True)

    assert "this account syncs once your organisation is verified" in response.content.decode()
    assert callbacks == []


@pytest.mark.parametrize("before", [True, False])
def test_editing_a_verified_providers_account_keeps_whether_it_sells(olga, ready, aws_sandbox, before):
    ProviderProfile.objects.filter(pk=ready.pk).update(state=ProviderState.VERIFIED)
    client = client_for(olga)
    client.post("/provider/accounts/connect/aws", _form(aws_sandbox))
    account = ProviderAccount.objects.get()
    ProviderAccount.objects.filter(pk=account.pk).update(enabled=before)  # staff may turn one account off

    response = client.post(f"/provider/accounts/{account.pk}/edit", _form(aws_sandbox, secret_access_key=""))

    assert response.status_code == 302
    assert ProviderAccount.objects.get().enabled is before


def _tencent_form(sandbox, **changes):
    return {
        "name": "intl",
        "regions": "ap-guangzhou",
        "endpoint_url": sandbox.url,
        "secret_id": TENCENT_TEST_CREDENTIALS["secret_id"],
        "secret_key": TENCENT_TEST_CREDENTIALS["secret_key"],
        **changes,
    }


def test_a_tencent_account_says_its_billing_site_and_an_unknown_one_is_refused(petra, tencent_sandbox):
    # Tencent's price answers carry no currency (CVM's Price structure), so the site the account bills on is
    # what tells CNY from USD: it is the seller's to say, and nothing else is taken for it.
    refused = client_for(petra).post("/provider/accounts/connect/tencent", _tencent_form(tencent_sandbox, site="usa"))
    assert refused.status_code == 200
    assert "the billing site is china or international, not 'usa'" in html.unescape(refused.content.decode())
    assert not ProviderAccount.objects.exists()

    saved = client_for(petra).post(
        "/provider/accounts/connect/tencent", _tencent_form(tencent_sandbox, site="international")
    )
    assert saved.status_code == 302, saved.context["form"].errors
    assert ProviderAccount.objects.get().options == {"site": "international"}


def test_a_seller_sets_and_removes_an_accounts_own_request_rate_limits(petra, aws_sandbox):
    """The limits a cloud granted this account (providers/ratelimit.py buckets, shared by every worker) are
    lines of the form; the edit page shows those stored, and a line taken out removes its option."""
    client = client_for(petra)
    limits = "DescribeInstances = 200/40\n\n  RunInstances=10/4  \n"
    response = client.post("/provider/accounts/connect/aws", _form(aws_sandbox, rate_limits=limits))
    assert response.status_code == 302, response.context["form"].errors
    account = ProviderAccount.objects.get()
    assert account.options == {"rate_limit.DescribeInstances": "200/40", "rate_limit.RunInstances": "10/4"}

    page = client.get(f"/provider/accounts/{account.pk}/edit").content.decode()
    assert "DescribeInstances = 200/40\nRunInstances = 10/4</textarea>" in html.unescape(page)

    response = client.post(
        f"/provider/accounts/{account.pk}/edit",
        _form(aws_sandbox, access_key_id="", secret_access_key="", rate_limits="RunInstances = 20/5"),
    )
    assert response.status_code == 302, response.context["form"].errors
    account.refresh_from_db()
    assert account.options == {"rate_limit.RunInstances": "20/5"}


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (
            "DescribeInstance = 200/40",
            "aws has no request bucket 'DescribeInstance' (did you mean 'DescribeInstances'?)",
        ),
        ("DescribeInstances = 1e3/40", "'1e3/40' is not <capacity>/<refill per second>"),
        ("DescribeInstances 200/40", "line 1: write group = capacity/refill"),
        ("RunInstances = 5/2\nRunInstances = 6/2", "line 2: RunInstances is given twice"),
    ],
)
def test_a_bad_rate_limit_line_is_a_field_error_and_saves_nothing(petra, aws_sandbox, limits, message):
    response = client_for(petra).post("/provider/accounts/connect/aws", _form(aws_sandbox, rate_limits=limits))

    assert response.status_code == 200
    errors = response.context["form"].errors["rate_limits"]
    assert any(message in e for e in errors), errors
    assert not ProviderAccount.objects.exists()


def test_a_cloud_form_offers_the_rate_limits_field_with_its_own_group_as_example(petra):
    page = client_for(petra).get("/provider/accounts/connect/azure").content.decode()

    assert 'name="rate_limits"' in page and 'placeholder="arm/reads = 100/20"' in page
