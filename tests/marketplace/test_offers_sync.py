"""Offer sync through the real AWS adapter against the sandbox."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from broker.devrun import OFFERS_SYNC
from marketplace.catalog.services import offers_sync
from marketplace.models import Offer, OfferStatus, PricePoint, QuarantinedOffer
from providers.models import ProviderAccount, SyncStatus
from providers.services import provider_account_connect
from sandboxes.aws.keys import BOB
from tests.conftest import AWS_TEST_CREDENTIALS

pytestmark = pytest.mark.django_db


def _connect(sandbox, **credentials):
    return provider_account_connect(
        provider_name="Petra Cloud Resale",
        kind="aws",
        name="aws-sandbox",
        credentials=credentials or AWS_TEST_CREDENTIALS,
        regions=["us-east-1"],
        endpoint_url=sandbox.url,
    )


def test_a_sync_ingests_the_sandbox_catalogue(aws_sandbox):
    account = _connect(aws_sandbox)

    outcome = offers_sync(account_id=account.pk)

    assert outcome.ok, outcome.error
    assert outcome.report.quarantined == 0
    account.refresh_from_db()
    assert account.sync_status == SyncStatus.OK
    p4de = Offer.objects.get(instance_type="p4de.24xlarge", pricing_model="on_demand", zone="us-east-1b")
    assert (p4de.gpu_model.key, p4de.gpu_count, str(p4de.price_usd)) == ("A100-80GB-SXM4", 8, "27.447050")
    g5 = Offer.objects.filter(instance_type="g5.xlarge", pricing_model="on_demand")
    assert {o.gpu_model.key for o in g5} == {"A10G"}
    assert PricePoint.objects.count() == outcome.report.price_changes == 0
    assert set(Offer.objects.values_list("price_since", flat=True)) == {p4de.first_seen_at}


def test_rejected_credentials_fail_the_sync_and_keep_the_last_offers_as_stale(aws_sandbox):
    account = _connect(aws_sandbox)
    assert offers_sync(account_id=account.pk).ok
    count = Offer.objects.count()
    account = _connect(aws_sandbox, access_key_id="bad-key", secret_access_key="x")

    outcome = offers_sync(account_id=account.pk)

    assert not outcome.ok
    assert "AuthFailure" in outcome.error
    account = ProviderAccount.objects.get(pk=account.pk)
    assert account.sync_status == SyncStatus.FAILED
    assert "AuthFailure" in account.sync_error
    assert Offer.objects.filter(status=OfferStatus.STALE).count() == count


def test_the_sync_command_reports_per_account_and_fails_on_a_bad_one(aws_sandbox, capsys):
    good = _connect(aws_sandbox)
    bad = provider_account_connect(
        provider_name="Other Seller",
        kind="aws",
        name="broken",
        credentials={"access_key_id": "bad-key", "secret_access_key": "x"},
        regions=["us-east-1"],
        endpoint_url=aws_sandbox.url,
    )

    with pytest.raises(CommandError, match="1 account"):
        call_command("offers", "sync")

    out, err = capsys.readouterr()
    assert f"account {good.pk} " in out
    assert f"account {bad.pk} " in err
    assert "sync FAILED" in err
    assert Offer.objects.filter(account=good).count() > 0


def test_the_run_commands_sync_starts_past_an_account_that_cannot_be_reached(aws_sandbox, capsys):
    good = _connect(aws_sandbox)
    bad = provider_account_connect(
        provider_name="Other Seller",
        kind="aws",
        name="gone",
        credentials={"access_key_id": "bad-key", "secret_access_key": "x"},
        regions=["us-east-1"],
        endpoint_url=aws_sandbox.url,
    )

    call_command(*OFFERS_SYNC)  # bin/run's start-up sync: it raised here, and bin/run refused to start

    err = capsys.readouterr().err
    assert f"account {bad.pk} " in err and "sync FAILED" in err and "1 account(s) failed to sync" in err
    assert Offer.objects.filter(account=good).count() > 0
    bad.refresh_from_db()
    assert bad.sync_status == "failed"


def test_provider_connect_checks_the_credentials(aws_sandbox, capsys):
    call_command(
        "provider",
        "connect",
        "--provider",
        "Petra Cloud Resale",
        "--kind",
        "aws",
        "--name",
        "main",
        "--credential",
        f"access_key_id={BOB.access_key_id}",
        "--credential",
        f"secret_access_key={BOB.secret_access_key}",
        "--endpoint-url",
        aws_sandbox.url,
        "--regions",
        "us-east-1,eu-west-1",
    )
    assert '"regions": ["us-east-1", "eu-west-1"]' in capsys.readouterr().out
    account = ProviderAccount.objects.get(name="main")
    assert BOB.access_key_id not in account.credentials_encrypted
    assert account.credentials().values["access_key_id"] == BOB.access_key_id

    with pytest.raises(CommandError, match="refused the account, nothing was saved: aws: AuthFailure"):
        call_command(
            "provider",
            "connect",
            "--provider",
            "Petra Cloud Resale",
            "--kind",
            "aws",
            "--name",
            "main",
            "--credential",
            "access_key_id=bad-key",
            "--credential",
            "secret_access_key=s",
            "--endpoint-url",
            aws_sandbox.url,
            "--regions",
            "us-east-1",
        )
    # The refused credentials replaced nothing: the account keeps the ones that passed.
    assert ProviderAccount.objects.get(name="main").credentials().values["access_key_id"] == BOB.access_key_id
    with pytest.raises(CommandError, match="expected KEY=VALUE"):
        call_command(
            "provider", "connect", "--provider", "P", "--kind", "aws", "--name", "n", "--credential", "oops",
            "--regions", "us-east-1",
        )  # fmt: skip


def test_offers_list_prints_json(aws_account, capsys):
    call_command("offers", "list", "--gpu", "H100-SXM5", "--pricing", "on_demand")

    import json

    rows = json.loads(capsys.readouterr().out)
    assert rows
    assert {r["gpu_model"] for r in rows} == {"H100-SXM5"}
    assert {r["pricing_model"] for r in rows} == {"on_demand"}


def test_the_periodic_sync_runs_one_task_per_enabled_account(aws_sandbox):
    from marketplace.tasks import offers_sync_all_task

    good = _connect(aws_sandbox)
    disabled = provider_account_connect(
        provider_name="Other Seller",
        kind="aws",
        name="paused",
        credentials=AWS_TEST_CREDENTIALS,
        regions=["us-east-1"],
        endpoint_url=aws_sandbox.url,
    )
    ProviderAccount.objects.filter(pk=disabled.pk).update(enabled=False)

    assert offers_sync_all_task.delay().get() == 1

    assert Offer.objects.filter(account=good).exists()
    assert not Offer.objects.filter(account=disabled).exists()
    assert ProviderAccount.objects.get(pk=disabled.pk).sync_status == SyncStatus.NEVER


def test_a_misconfigured_account_fails_its_sync_with_the_reason(aws_sandbox):
    account = _connect(aws_sandbox)
    ProviderAccount.objects.filter(pk=account.pk).update(options={"read_timeout": "soon"})

    outcome = offers_sync(account_id=account.pk)

    assert not outcome.ok
    assert "misconfigured: options.read_timeout: 'soon' is not a number" in outcome.error
    assert ProviderAccount.objects.get(pk=account.pk).sync_status == SyncStatus.FAILED


def test_the_sync_command_says_what_quarantined_means_and_why(aws_sandbox):
    from django.utils import timezone

    from marketplace.catalog.services import offers_ingest
    from marketplace.management.commands.offers import _quarantine_note
    from providers.types import PricingModel
    from tests.factories import listed_quotes

    account = _connect(aws_sandbox)
    rows = [("x9.large", "GTX-9999", 1, 24, "1.00", "us-east-1", PricingModel.ON_DEMAND),
            ("x9.xlarge", "GTX-9999", 2, 24, "2.00", "us-east-1", PricingModel.ON_DEMAND),
            ("g5.xlarge", "A10G", 1, 24, "0", "us-east-1", PricingModel.ON_DEMAND)]  # fmt: skip
    offers_ingest(account=account, quotes=listed_quotes(rows), now=timezone.now())
    assert QuarantinedOffer.objects.filter(account=account).count() == 3

    note = _quarantine_note(account)

    assert "rows the provider listed that the broker will not sell" in note
    assert "2 x unknown GPU model 'GTX-9999' (no spec sheet); 1 x price 0 is zero or negative" in note
