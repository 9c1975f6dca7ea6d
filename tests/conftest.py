"""Shared fixtures: personas (alice buyer, bob her teammate, charlie a stranger, petra a provider admin)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery._state import _set_task_join_will_block

from broker.celery import app as celery_app
from marketplace.models import Organization, OrganizationKind, Role
from providers.aws.order_resources import default_images_forget
from sandboxes.aws import keys as aws_keys
from tests.factories import MembershipFactory, OrganizationFactory, SshKeyFactory


def pytest_configure(config):
    from django.conf import settings

    settings.PASSWORD_HASHERS = ["tests.hashers.QuickPBKDF2PasswordHasher"]
    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # The test database is thrown away: its commits need not wait for the disk (about 0.4 ms each here),
        # which the live-server, worker and transactional tests make by the thousand. Nothing else changes.
        options = settings.DATABASES["default"].setdefault("OPTIONS", {})
        options["options"] = f"{options.get('options', '')} -c synchronous_commit=off".strip()


@pytest.fixture(autouse=True)
def _eager_celery():
    """Tasks run in-process unless a test starts a real worker (tests/test_worker.py)."""
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager = False
    # An eager task sets Celery's process-wide "a join would block" flag for its run and restores what it found;
    # eager tasks racing in threads (tests/races.py) can restore each other's True and leave it set, so a later
    # test's result.get() would be refused as if called inside a task.
    _set_task_join_will_block(False)


@pytest.fixture
def throttle_mid_window(monkeypatch):
    """The API throttle counts per fixed window of the wall clock, so a test whose requests straddle a window's
    edge would see its count reset half-way: pin the throttle's clock in the middle of a minute (and of every
    shorter window) for the test's length."""
    pinned = 1_800_000_030.0  # 30 s into a minute
    monkeypatch.setattr("marketplace.api.throttling.time", SimpleNamespace(time=lambda: pinned))


@pytest.fixture(autouse=True)
def _aws_default_images_forgotten():
    """The AWS adapter remembers a region's default image per process (providers/aws/order_resources.py); each
    test's sandbox starts with its own images and faults, so each test starts with nothing remembered."""
    default_images_forget()


@pytest.fixture(autouse=True)
def _api_unthrottled(settings):
    """API rate limits are tests/api/test_throttling.py's subject; elsewhere their counts, shared through Redis,
    would make one test's requests another's 429."""
    settings.API_RATES = {}


@pytest.fixture(autouse=True)
def _ledger_wipe_after_transactional_tests(request):
    """A transactional test ends with Django flushing every table, which the ledger's append-only triggers
    refuse unless the session allows a wipe: allow it just for that flush."""
    marker = request.node.get_closest_marker("django_db")
    transactional = "transactional_db" in request.fixturenames or bool(marker and marker.kwargs.get("transaction"))
    if not transactional:
        yield
        return
    from ledger.services import ledger_allow_wipe

    request.getfixturevalue("_django_db_helper")  # set up first, so it flushes after this teardown
    ledger_allow_wipe(False)
    yield
    ledger_allow_wipe(True)


@pytest.fixture(autouse=True)
def _book_balances_after_test(request):
    """Issue 22: after every test that used the database, the double-entry book sums to zero in each currency
    (every entry balanced), whatever the test did to money."""
    uses_db = request.node.get_closest_marker("django_db") is not None or any(
        name in request.fixturenames for name in ("db", "transactional_db", "django_db_reset_sequences")
    )
    if not uses_db:
        yield
        return
    request.getfixturevalue("_django_db_helper")  # set up first, so the database is still there at teardown
    yield
    from marketplace.billing.book import book_check

    unbalanced = {currency: total for currency, total in book_check().items() if total}
    assert not unbalanced, f"the book does not balance after this test: {unbalanced} (minor units)"


@pytest.fixture
def migrate_to(transactional_db):
    """``migrate_to([(app, migration)])`` takes the test database back to that state and returns its historical
    apps; afterwards, pass or fail, the database is migrated forward again, or every later test meets an old
    schema."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    def migrate(target):
        executor = MigrationExecutor(connection)
        executor.migrate(target)
        return executor.loader.project_state(target).apps

    yield migrate
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.fixture
def acme(db) -> Organization:
    return OrganizationFactory(name="Acme Research", kind=OrganizationKind.BUYER)


@pytest.fixture
def alice(acme):
    """Acme's owner, who has added her laptop's SSH key to the organisation (orders install it by default)."""
    user = MembershipFactory(user__username="alice", organization=acme, role=Role.OWNER).user
    SshKeyFactory(organization=acme, created_by=user)
    return user


@pytest.fixture
def alice_bearer(acme, alice) -> str:
    """The Authorization header of a token with every scope of alice's in acme: the API's one kind of token."""
    from marketplace.api.tokens import api_token_create
    from marketplace.models import TokenScope

    return f"Bearer {api_token_create(organization=acme, user=alice, name='tests', scopes=TokenScope.values).raw}"


@pytest.fixture
def bob(acme):
    return MembershipFactory(user__username="bob", organization=acme, role=Role.MEMBER).user


@pytest.fixture
def charlie(db):
    membership = MembershipFactory(user__username="charlie", organization__name="Charlie Labs", role=Role.OWNER)
    SshKeyFactory(organization=membership.organization, created_by=membership.user, name="charlie@laptop")
    return membership.user


# --- Sandbox clouds -----------------------------------------------------------------------------------------

TEST_AWS_REGIONS = ["us-east-1", "eu-west-1"]


@pytest.fixture(scope="session")
def aws_sandbox_server():
    from sandboxes.aws.app import start_aws_sandbox

    sandbox = start_aws_sandbox()
    _SANDBOX_SERVERS.append(sandbox)
    yield sandbox
    sandbox.stop()


@pytest.fixture
def aws_sandbox(aws_sandbox_server):
    """The session's AWS sandbox with no faults and no instances."""
    aws_sandbox_server.reset()
    yield aws_sandbox_server
    aws_sandbox_server.reset()


@pytest.fixture(scope="session")
def _aws_quotes(aws_sandbox_server):
    """The sandbox catalogue read once per session through the real adapter (it is read-only)."""
    from providers.aws.adapter import AwsAdapter
    from providers.types import Credentials

    credentials = Credentials(kind="aws", values=AWS_TEST_CREDENTIALS, endpoint_url=aws_sandbox_server.url)
    return AwsAdapter(credentials, TEST_AWS_REGIONS).list_offers()


# Petra's key is one the AWS sandbox knows: it refuses any other (sandboxes/aws/keys.py).
AWS_TEST_CREDENTIALS = aws_keys.PETRA.credentials()


@pytest.fixture
def aws_account(db, aws_sandbox, _aws_quotes):
    """Petra's AWS account pointed at the sandbox, with its offers ingested."""
    from django.utils import timezone

    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.catalog.services import offers_ingest
    from marketplace.models import GpuModel
    from providers.models import ProviderAccount
    from providers.services import provider_account_connect

    if not GpuModel.objects.exists():
        # A transactional test before this one flushed the rows the data migration seeded.
        gpu_models_upsert(GpuModel)
    account = provider_account_connect(
        provider_name="Petra Cloud Resale",
        kind="aws",
        name="aws-sandbox",
        credentials=AWS_TEST_CREDENTIALS,
        regions=TEST_AWS_REGIONS,
        endpoint_url=aws_sandbox.url,
    )
    offers_ingest(account=account, quotes=_aws_quotes, now=timezone.now())
    return ProviderAccount.objects.get(pk=account.pk)


TENCENT_TEST_CREDENTIALS = {"secret_id": "AKIDPETRATENCENT0001", "secret_key": "petra-tencent-secret"}


@pytest.fixture(scope="session")
def tencent_sandbox_server():
    from sandboxes.tencent.app import start_tencent_sandbox

    # Instances start at once, so an eagerly run poll sees them running on its first look.
    sandbox = start_tencent_sandbox(launch_seconds=0, terminate_seconds=0)
    sandbox.register_secret(TENCENT_TEST_CREDENTIALS["secret_id"], TENCENT_TEST_CREDENTIALS["secret_key"])
    _SANDBOX_SERVERS.append(sandbox)
    yield sandbox
    sandbox.stop()


@pytest.fixture
def tencent_sandbox(tencent_sandbox_server):
    tencent_sandbox_server.reset()
    tencent_sandbox_server.register_secret(
        TENCENT_TEST_CREDENTIALS["secret_id"], TENCENT_TEST_CREDENTIALS["secret_key"]
    )
    yield tencent_sandbox_server
    tencent_sandbox_server.reset()


@pytest.fixture
def tencent_account(db, tencent_sandbox):
    """Petra's Tencent Cloud account pointed at the sandbox, synced through the real adapter."""
    from marketplace.catalog.services import offers_sync
    from providers.models import ProviderAccount
    from providers.services import provider_account_connect

    account = provider_account_connect(
        provider_name="Petra Cloud Resale",
        kind="tencent",
        name="tencent-sandbox",
        credentials=TENCENT_TEST_CREDENTIALS,
        regions=["ap-guangzhou", "ap-shanghai"],
        endpoint_url=tencent_sandbox.url,
    )
    outcome = offers_sync(account_id=account.pk)
    assert outcome.ok, outcome.error
    return ProviderAccount.objects.get(pk=account.pk)


@pytest.fixture(scope="session")
def gcp_sandbox_server():
    from sandboxes.gcp.app import GcpSandbox

    # Operations finish at once, so an eagerly run poll sees the instance running on its first look.
    sandbox = GcpSandbox(settle_seconds=0)
    sandbox.start()
    _SANDBOX_SERVERS.append(sandbox)
    yield sandbox
    sandbox.stop()


@pytest.fixture
def gcp_sandbox(gcp_sandbox_server):
    gcp_sandbox_server.reset()
    yield gcp_sandbox_server
    gcp_sandbox_server.reset()


@pytest.fixture
def gcp_account(db, gcp_sandbox):
    """Petra's GCP project pointed at the sandbox (us-central1 and europe-west4), synced through the real adapter."""
    import json

    from marketplace.catalog.services import offers_sync
    from providers.models import ProviderAccount
    from providers.services import provider_account_connect

    key = gcp_sandbox.new_service_account("broker@petra-gpu.iam.gserviceaccount.com", "petra-gpu")
    account = provider_account_connect(
        provider_name="Petra Cloud Resale",
        kind="gcp",
        name="gcp-sandbox",
        credentials={"service_account_json": json.dumps(key), "project_id": "petra-gpu"},
        regions=["us-central1", "europe-west4"],
        endpoint_url=gcp_sandbox.url,
    )
    outcome = offers_sync(account_id=account.pk)
    assert outcome.ok, outcome.error
    return ProviderAccount.objects.get(pk=account.pk)


def _sandbox_account(kind: str, sandbox, provider_name: str = "Petra Cloud Resale"):
    """Petra's account of ``kind`` connected to ``sandbox`` the way the run command connects it
    (``sandboxes.demo``), its offers synced through the real adapter."""
    from marketplace.catalog.gpu_specs import gpu_models_upsert
    from marketplace.catalog.services import offers_sync
    from marketplace.models import GpuModel
    from providers.models import ProviderAccount
    from providers.services import provider_account_connect
    from sandboxes.demo import SANDBOX_ACCOUNTS

    if not GpuModel.objects.exists():
        # A transactional test before this one flushed the rows the data migration seeded.
        gpu_models_upsert(GpuModel)
    how = SANDBOX_ACCOUNTS[kind](sandbox)
    account = provider_account_connect(
        provider_name=provider_name,
        kind=kind,
        name=f"{kind}-sandbox",
        credentials=how.credentials,
        regions=how.demo_regions,
        endpoint_url=how.endpoint_url,
        options=how.options,
    )
    outcome = offers_sync(account_id=account.pk)
    assert outcome.ok, outcome.error
    return ProviderAccount.objects.get(pk=account.pk)


@pytest.fixture(scope="session")
def azure_sandbox_server():
    from sandboxes.azure.app import start_azure_sandbox

    sandbox = start_azure_sandbox()
    _SANDBOX_SERVERS.append(sandbox)
    yield sandbox
    sandbox.stop()


@pytest.fixture
def azure_sandbox(azure_sandbox_server):
    azure_sandbox_server.reset()
    yield azure_sandbox_server
    azure_sandbox_server.reset()


@pytest.fixture
def azure_account(db, azure_sandbox):
    """Petra's Azure subscription pointed at the sandbox, synced through the real adapter."""
    return _sandbox_account("azure", azure_sandbox)


@pytest.fixture(scope="session")
def kubernetes_sandbox_server():
    from sandboxes.kubernetes.app import start_kubernetes_sandbox

    sandbox = start_kubernetes_sandbox()
    _SANDBOX_SERVERS.append(sandbox)
    yield sandbox
    sandbox.stop()


@pytest.fixture
def kubernetes_sandbox(kubernetes_sandbox_server):
    kubernetes_sandbox_server.reset()
    yield kubernetes_sandbox_server
    kubernetes_sandbox_server.reset()


@pytest.fixture
def kubernetes_account(db, kubernetes_sandbox):
    """Kai's cluster (the Kubernetes sandbox) connected as the run command connects it, synced through the real
    adapter: its nodes' GPUs, MIG slices and shares on sale, each node a capacity pool."""
    return _sandbox_account("kubernetes", kubernetes_sandbox, provider_name="Kai's Neocloud")


@pytest.fixture(scope="session")
def alibaba_sandbox_server():
    from sandboxes.alibaba.app import start_alibaba_sandbox

    sandbox = start_alibaba_sandbox()
    _SANDBOX_SERVERS.append(sandbox)
    yield sandbox
    sandbox.stop()


@pytest.fixture
def alibaba_sandbox(alibaba_sandbox_server):
    alibaba_sandbox_server.reset()
    yield alibaba_sandbox_server
    alibaba_sandbox_server.reset()


@pytest.fixture
def alibaba_account(db, alibaba_sandbox):
    """Petra's Alibaba Cloud account pointed at the sandbox, synced through the real adapter."""
    return _sandbox_account("alibaba", alibaba_sandbox)


@pytest.fixture
def machines_phone_home(live_server, settings, aws_sandbox_server):
    """Sandboxed machines boot by themselves: each launch's boot script names the live server as the broker
    (``BROKER_PUBLIC_URL``), and every sandbox runs the agents of the instances it boots in threads, which
    phone home over HTTP as real machines do. Returns the URL, for worker processes' environment."""
    from sandboxes.boot import BootMode

    settings.PUBLIC_URL = live_server.url
    started = [s for s in _SANDBOX_SERVERS if s is not None]
    for sandbox in started:
        sandbox.booter.mode = BootMode.THREAD
    yield live_server.url
    for sandbox in started:
        sandbox.booter.reset()
        sandbox.booter.mode = BootMode.HOLD


# The session's sandboxes, as they start, so ``machines_phone_home`` reaches every one a test uses.
_SANDBOX_SERVERS: list[object] = []


# --- Independent hosts --------------------------------------------------------------------------------------


@pytest.fixture
def fleet(db):
    """Helga's community account, with no machines yet."""
    from providers.services import provider_account_connect

    return provider_account_connect(
        provider_name="Helga's GPU Farm", kind="community", name="fleet", credentials={}, regions=["eu-de"]
    )


@pytest.fixture
def held_hosts(fleet):
    """Two verified 8x H100 machines of the fleet on sale, whose agents hold each lease for the test to boot
    (``tests.leases.boot``)."""
    from marketplace.catalog.services import offers_sync
    from tests.hosts import start_hosts, stop_hosts

    agents = start_hosts(fleet, ["fra-h100-1", "fra-h100-2"], lease_threads=False)
    assert offers_sync(account_id=fleet.pk).ok
    yield agents
    stop_hosts(agents)


@pytest.fixture(scope="session")
def _stripe_server():
    """One Stripe sandbox for the session (sandboxes/stripe/app.py); each test resets it."""
    from sandboxes.stripe.app import start_stripe_sandbox

    server = start_stripe_sandbox()
    yield server
    server.stop()


@pytest.fixture
def stripe_sandbox(_stripe_server, settings):
    """The Stripe sandbox, reset, with the broker's settings pointing the real SDK at it."""
    _stripe_server.reset()
    settings.STRIPE_API_BASE = _stripe_server.url
    settings.STRIPE_API_KEY = "sk_test_sandbox"
    settings.STRIPE_WEBHOOK_SECRET = _stripe_server.set_webhook_endpoint(secret="whsec_test_broker")
    settings.STRIPE_TIMEOUT_SECONDS = 5.0
    yield _stripe_server
    _stripe_server.reset()


@pytest.fixture
def sdk(stripe_sandbox):
    """The official Stripe SDK on the sandbox, acting as someone other than the broker (a connected account's
    own system, or a test reading what Stripe holds)."""
    import stripe

    return stripe.StripeClient("sk_test_sandbox", base_addresses={"api": stripe_sandbox.url})


@pytest.fixture
def prepaid(acme):
    """Acme on prepaid terms, as every sign-up is."""
    Organization.objects.filter(pk=acme.pk).update(payment_terms="prepaid")
    acme.refresh_from_db()
    return acme


@pytest.fixture
def ready_to_pay(prepaid, alice):
    """Acme prepaid, Alice's address verified, and a billing country (GB: 20 % VAT): a top-up may go ahead."""
    from django.utils import timezone

    from marketplace.models.billing import BillingProfile, EmailVerification

    EmailVerification.objects.create(user=alice, email=alice.email.lower(), verified_at=timezone.now())
    BillingProfile.objects.create(organization=prepaid, country="GB")
    return prepaid
