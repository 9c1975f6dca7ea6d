"""Issue 18: EC2's GPU partitions (g6f: an eighth, a quarter or a half of one NVIDIA L4) are sold as fractions
of an L4, not quarantined as "0 GPUs".

How AWS reports them: DescribeInstanceTypes' ``GpuDeviceInfo`` has ``count`` ("the number of GPUs"), which is 0
for a partition, ``logicalGpuCount`` ("total number of GPU devices of this type") and ``gpuPartitionSize`` ("the
size of each GPU as a fraction of a full GPU, between 0 (excluded) and 1 (included)"), with ``memoryInfo`` the
slice's memory (EC2 API reference, GpuDeviceInfo,
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GpuDeviceInfo.html). AWS sells g6f.large and
g6f.xlarge as 1/8 of an L4 with 3 GB, g6f.2xlarge as 1/4 with 6 GB and g6f.4xlarge as 1/2 with 12 GB (Amazon
ECS Developer Guide, "Specifying GPUs in an Amazon ECS task definition",
https://docs.aws.amazon.com/AmazonECS/latest/developerguide/ecs-gpu-specifying.html).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import boto3
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.api.tokens import api_token_create
from marketplace.catalog.selectors import offer_views
from marketplace.catalog.services import offers_sync
from marketplace.models import Offer, QuarantinedOffer
from providers.aws import catalog
from providers.aws.adapter import AwsAdapter
from providers.services import provider_account_connect
from providers.types import GPU_FRACTION, OfferQuote, PricingModel
from sandboxes.aws.app import AwsSandbox
from sandboxes.aws.keys import PETRA
from tests.leases import running_order

AdapterFactory = Callable[..., AwsAdapter]
REGION = "eu-central-1"
# (share of an L4, GB of its memory, seeded on-demand USD/h in eu-central-1)
SLICES = {
    "g6f.large": (0.125, 3, Decimal("0.25261")),
    "g6f.xlarge": (0.125, 3, Decimal("0.297")),
    "g6f.2xlarge": (0.25, 6, Decimal("0.594")),
    "g6f.4xlarge": (0.5, 12, Decimal("1.188")),
}


def test_the_sandbox_reports_a_partition_as_ec2_does(aws_sandbox: AwsSandbox) -> None:
    ec2 = boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=aws_sandbox.url,
        aws_access_key_id=PETRA.access_key_id,
        aws_secret_access_key=PETRA.secret_access_key,
    )

    (described,) = ec2.describe_instance_types(InstanceTypes=["g6f.large"])["InstanceTypes"]

    (gpu,) = described["GpuInfo"]["Gpus"]
    assert (gpu["Name"], gpu["Count"], gpu["LogicalGpuCount"], gpu["GpuPartitionSize"]) == ("L4", 0, 1, 0.125)
    assert gpu["MemoryInfo"] == {"SizeInMiB": 2861}
    assert sorted(aws_sandbox.zones(REGION, "g6f.large")) == ["eu-central-1a", "eu-central-1b"]


def test_a_g6f_type_becomes_a_fractional_l4_quote(aws_sandbox: AwsSandbox, aws_adapter: AdapterFactory) -> None:
    offers = aws_adapter(regions=[REGION]).list_offers()

    quote = next(o for o in offers if o.natural_key == (REGION, "eu-central-1a", "g6f.large", "on_demand"))
    assert quote == OfferQuote(
        region=REGION,
        zone="eu-central-1a",
        instance_type="g6f.large",
        pricing_model=PricingModel.ON_DEMAND,
        gpu_model="L4",
        gpu_count=1,
        gpu_memory_gb=3,
        vcpus=2,
        memory_gib=Decimal(8),
        price=Decimal("0.25261"),
        currency="USD",
        capacity=None,
        interconnect="pcie",
        extra={
            "gpu_name": "L4",
            "gpu_manufacturer": "NVIDIA",
            "gpu_memory_mib": 2861,
            "network_performance": quote.extra["network_performance"],
            "efa_supported": False,
            "architectures": ["x86_64"],
            "network_gbps": catalog.network_gbps(quote.extra["network_performance"]),
            GPU_FRACTION: 0.125,
            "price_sku": quote.extra["price_sku"],
        },
    )
    sliced = {o.instance_type: (o.gpu_model, o.gpu_count, o.extra[GPU_FRACTION], o.gpu_memory_gb, o.price)
              for o in offers if o.instance_type in SLICES}  # fmt: skip
    assert sliced == {name: ("L4", 1, share, gb, price) for name, (share, gb, price) in SLICES.items()}


@pytest.fixture
def frankfurt(db, aws_sandbox: AwsSandbox):
    """Petra's account on the sandbox's eu-central-1, where the g6f slices are priced; not synced yet."""
    return provider_account_connect(
        provider_name="Petra Cloud Resale",
        kind="aws",
        name="frankfurt",
        credentials=PETRA.credentials(),
        regions=[REGION],
        endpoint_url=aws_sandbox.url,
    )


def test_a_synced_g6f_offer_is_on_sale_as_a_fraction_and_not_quarantined(frankfurt) -> None:
    account = frankfurt
    outcome = offers_sync(account_id=account.pk)

    assert outcome.ok, outcome.error
    assert outcome.report is not None and outcome.report.quarantined == 0
    assert not QuarantinedOffer.objects.filter(instance_type__startswith="g6f.").exists()
    rows = Offer.objects.filter(account=account, instance_type__startswith="g6f.").select_related("gpu_model")
    seen: dict[str, Any] = {
        o.instance_type: (o.gpu_model.key, o.gpu_count, o.gpu_memory_gb, o.extra[GPU_FRACTION], o.price_per_gpu_usd)
        for o in rows
    }
    # A slice's price per GPU is per whole card's worth of it: an eighth at 0.25261 is 2.02088 a card.
    assert seen == {
        name: ("L4", 1, gb, share, pytest.approx(float(price) / share)) for name, (share, gb, price) in SLICES.items()
    }
    views = {v.instance_type: v.gpu_fraction for v in offer_views(now=timezone.now()) if v.account_id == account.pk}
    assert {name: views[name] for name in SLICES} == {name: share for name, (share, _, _) in SLICES.items()}
    assert views["g6.8xlarge"] == 1.0


def test_the_storefront_shows_a_slice_as_its_share_of_a_card_priced_per_card(frankfurt, client) -> None:
    assert offers_sync(account_id=frankfurt.pk).ok

    page = client.get("/", {"q": "gpu=L4 region=eu-central-1"}).content.decode()
    row = page[page.rindex("<tr", 0, page.index("<code>g6f.large</code>")) :]
    row = row[: row.index("</tr>")]
    # The GPUs column says what is sold (an eighth of an L4) and $/GPU-h is per whole card, as offers are sorted.
    assert '<span title="a partition: 1/8 of one card">1/8</span>' in row
    assert f">{Decimal('0.25261') * 8:.4f}<" in row


def test_the_order_form_names_a_slice_as_its_share_of_one_card(frankfurt, client, alice) -> None:
    assert offers_sync(account_id=frankfurt.pk).ok
    client.force_login(alice)
    eighth = Offer.objects.filter(account=frankfurt, instance_type="g6f.large", pricing_model="on_demand")[0]

    page = client.get("/orders/new", {"offer": eighth.pk}).content.decode()

    assert "1/8 of one L4" in page and "a partition of the card" in page and "1\u00d7 L4" not in page


def test_a_quote_for_one_l4_gets_whole_cards_unless_it_asks_for_slices(frankfurt, acme, alice) -> None:
    assert offers_sync(account_id=frankfurt.pk).ok
    api = APIClient()
    raw = api_token_create(organization=acme, user=alice, name="quotes", scopes=["orders:place"]).raw
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    asked = {"profile": "inference", "gpu_models": ["L4"], "regions": ["eu-central-1"], "pricing_models": ["on_demand"]}

    whole = api.post("/api/v1/quotes", asked, format="json").json()
    sliced = api.post("/api/v1/quotes", {**asked, "fractions": True}, format="json").json()

    assert whole["quotes"] and not any(q["offer"]["instance_type"].startswith("g6f.") for q in whole["quotes"])
    g6f = Offer.objects.filter(account=frankfurt, instance_type__startswith="g6f.", pricing_model="on_demand")
    assert whole["rejected"]["whole cards"] == g6f.count() > 0  # every g6f size in every zone
    assert any(q["offer"]["instance_type"].startswith("g6f.") for q in sliced["quotes"])


def test_an_order_for_a_slice_runs_on_the_slice_its_machine_shows(
    frankfurt, acme, alice, aws_sandbox: AwsSandbox, django_capture_on_commit_callbacks
) -> None:
    """What a buyer of an eighth of an L4 gets is a machine whose one GPU is an L4 with an eighth of its memory
    (GpuDeviceInfo's ``memoryInfo`` is the slice's): the lease check takes that as the order, not as a short
    whole card."""
    assert offers_sync(account_id=frankfurt.pk).ok
    eighth = Offer.objects.get(
        account=frankfurt, instance_type="g6f.large", pricing_model="on_demand", zone="eu-central-1a"
    )

    order = running_order(acme, alice, eighth, django_capture_on_commit_callbacks, aws_sandbox, allow_failover=False)

    (seen,) = order.leases.get(state="ready").gpus
    assert (seen["name"], seen["memory_gb"]) == ("NVIDIA L4", 3)


def test_a_machine_with_a_smaller_slice_than_sold_is_refused(frankfurt, acme, alice) -> None:
    """A quarter of an L4 sold and an eighth delivered is not the order: the problem names the share."""
    from marketplace.launch.leases import GpuReport, gpu_problem
    from marketplace.models import Order

    assert offers_sync(account_id=frankfurt.pk).ok
    quarter = Offer.objects.filter(account=frankfurt, instance_type="g6f.2xlarge")[0]
    order = Order(offer=quarter, gpu_model=quarter.gpu_model, gpu_count=1)

    assert gpu_problem(order, (GpuReport(index=0, name="NVIDIA L4", memory_gb=6),)) == ""
    problem = gpu_problem(order, (GpuReport(index=0, name="NVIDIA L4", memory_gb=3),))
    assert problem == "the order is for 1x 1/4 of one L4; the machine has 1x NVIDIA L4 3 GB"
