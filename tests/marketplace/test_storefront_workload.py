"""The storefront's workload page, rendered by the real views over real rows: form, ranked quotes, ordering."""

from __future__ import annotations

import datetime as dt
import html
import re
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from marketplace.catalog.services import offers_ingest
from marketplace.models import Order, Quote
from providers.types import PricingModel
from tests.factories import ProviderAccountFactory, listed_quotes

pytestmark = pytest.mark.django_db

OD, SPOT = PricingModel.ON_DEMAND, PricingModel.SPOT


@pytest.fixture
def book(db):
    account = ProviderAccountFactory(provider__name="Petra Cloud Resale", name="main")
    rows = [
        ("g5.xlarge", "A10G", 1, 24, "1.006", "us-east-1", OD, None),
        ("g5.xlarge", "A10G", 1, 24, "0.4507", "us-east-1", SPOT, None),
        ("g4dn.xlarge", "T4", 1, 16, "0.526", "us-east-1", OD, None),
        ("p4de.24xlarge", "A100-80GB-SXM4", 8, 80, "27.44705", "us-east-1", OD, 1),
        ("p5.48xlarge", "H100-SXM5", 8, 80, "55.04", "us-west-2", OD, 1),
    ]
    quotes = listed_quotes(rows)
    offers_ingest(account=account, quotes=quotes, now=timezone.now() - dt.timedelta(seconds=5))
    return account


@pytest.fixture
def browser(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def _form(**fields: object) -> dict[str, object]:
    return {"duration_hours": "8", "interruption_tolerance": "checkpointed", **fields}


def _text(page: str) -> str:
    """The page's text with tags dropped and whitespace collapsed, as a reader sees it."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_the_workload_page_needs_a_login(book):
    response = Client().get("/workload/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_the_form_shows_every_profile_with_its_defaults(browser, book):
    page = browser.get("/workload/").content.decode()

    assert '<form method="post" class="filters" id="workload-form">' in page
    assert 'name="csrfmiddlewaretoken"' in page
    for text in (
        "training: Large-model training: 80 GB or more per GPU and 600 GB/s NVLink between the GPUs of a job.",
        "fine-tuning: Fine-tuning (LoRA and full): 24 GB or more per GPU; NVLink not required.",
        "inference: Real-time inference: cheap low-latency cards of the T4, L4, A10 and A10G class.",
        "scientific: Scientific computing: FP64 of 10 TFLOPS or more per GPU, with ECC memory.",
        "transcoding: Video transcoding: GPUs with hardware encoders; throughput counts the encoders.",
    ):
        assert text in html.unescape(page)
    assert 'name="duration_hours" value="8"' in page
    assert '<option value="checkpointed" selected>' in page
    assert "Get quotes" in page
    assert "Order at this price" not in page
    assert Quote.objects.count() == 0


def test_a_submitted_workload_shows_ranked_quotes_with_their_reasons(browser, book):
    response = browser.post("/workload/", _form(profile="inference", duration_hours="10"))

    assert response.status_code == 200
    page = response.content.decode()
    text = _text(page)
    quotes = list(Quote.objects.order_by("rank"))
    assert [q.rank for q in quotes] == [1, 2, 3]
    assert "3 quotes, prices locked until" in text
    # Best first, each row with its reason and its own order button carrying its quote id.
    positions = [page.index(q.reason) for q in quotes]
    assert positions == sorted(positions)
    assert quotes[0].reason.startswith("1x A10G spot on aws us-east-1a")
    assert "(best value;" in quotes[0].reason
    assert page.count("Order at this price") == 3
    for q in quotes:
        assert f'href="/orders/new?quote={q.public_id}"' in page
    assert "0.4507" in page
    assert "4.51" in page  # the spot quote's total for 10 hours
    # The defaults the profile applied are spelled out.
    assert "Ranked by dollars for the job; throughput measured in GB/s of memory bandwidth" in text
    assert "models A10, A10G, L4, T4;" in text  # sorted, whatever the set order
    assert "10.0 h, interruptions: checkpointed." in text


def test_the_buyer_picks_gpu_models_from_those_on_sale_and_only_they_are_quoted(browser, book):
    page = browser.get("/workload/").content.decode()
    picker = re.search(r'<select name="gpu_models"[^>]*multiple[^>]*>(.*?)</select>', page, re.S)
    assert picker, "the form has a GPU model picker"
    assert re.findall(r'<option value="([^"]+)"', picker.group(1)) == ["A100-80GB-SXM4", "A10G", "H100-SXM5", "T4"]

    text = _text(browser.post("/workload/", _form(profile="inference", gpu_models=["T4"])).content.decode())

    assert [q.offer.gpu_model.key for q in Quote.objects.order_by("rank")] == ["T4"]
    assert "models T4;" in text
    refused = browser.post("/workload/", _form(profile="inference", gpu_models=["RTX-9999"]))
    assert refused.status_code == 200 and "Select a valid choice. RTX-9999 is not one of the available choices." in (
        html.unescape(refused.content.decode())
    )
    assert Quote.objects.count() == 1


def test_a_training_workload_lists_the_memory_and_interconnect_defaults(browser, book):
    page = _text(browser.post("/workload/", _form(profile="training", gpu_count="8")).content.decode())

    assert "≥ 80 GB per GPU;" in page
    assert "≥ 600 GB/s GPU interconnect for multi-GPU jobs;" in page
    # Training fixes the work, not the hours: the page says so (issue 20).
    assert "8.0 h of work on the reference GPU (a faster card finishes sooner)" in page
    assert "p5.48xlarge" in page
    assert "p4de.24xlarge" in page
    assert "g5.xlarge" not in page


def test_with_nothing_feasible_the_page_says_what_to_relax(browser, book):
    page = _text(
        browser.post("/workload/", _form(profile="training", gpu_count="8", max_price_per_hour="10")).content.decode()
    )

    assert "Nothing on sale fits this workload." in page
    assert "p5.48xlarge in us-west-2 (H100-SXM5, 55.04 USD/h): fails price cap — raise the hourly cap to $55.04" in page
    assert "raise the hourly cap to $27.45" in page
    assert Quote.objects.count() == 0


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"profile": "training", "gpu_count": "0"}, "Ensure this value is greater than or equal to 1."),
        (
            {"profile": "training", "gpu_count": "2", "total_gpu_memory_gb": "160"},
            "give GPUs or total memory, not both",
        ),
        ({"gpu_count": "1"}, "This field is required."),
        ({"profile": "gaming"}, "Select a valid choice. gaming is not one of the available choices."),
        ({"profile": "training", "duration_hours": "0"}, "Ensure this value is greater than or equal to 0.01."),
    ],
)
def test_bad_input_shows_the_form_error_and_quotes_nothing(browser, book, fields, error):
    response = browser.post("/workload/", _form(**fields))

    assert response.status_code == 200
    page = html.unescape(response.content.decode())
    assert f'<span class="err">{error}</span>' in page
    assert "Order at this price" not in page
    assert Quote.objects.count() == 0


def _configure_quote(browser: Client, quote: Quote, hours: str | None = None) -> str:
    """The quote's configure step (the duration it fills in, or ``hours``; just the machine, the organisation's
    keys) sent; the confirmation's nonce."""
    page = browser.get(f"/orders/new?quote={quote.public_id}").content.decode()
    nonce = re.search(r'name="nonce" value="([^"]+)"', page).group(1)
    duration = hours or re.search(r'name="duration_hours" id="id_duration_hours" [^>]*value="([^"]*)"', page).group(1)
    keys = re.findall(r'name="ssh_keys" value="([^"]+)" checked', page)
    configured = browser.post(
        "/orders/new",
        {"quote": quote.public_id, "nonce": nonce, "duration_hours": duration, "ssh_keys": keys,
         "workload_kind": "none", "access": "mine", "env_rows": "0"},
    )  # fmt: skip
    assert configured.status_code == 302, configured.content.decode()
    assert "locked until" in browser.get(configured["Location"]).content.decode()
    return nonce


def test_an_order_placed_from_a_quote_pays_the_quoted_price_and_shows_on_my_orders(
    browser, book, django_capture_on_commit_callbacks
):
    browser.post("/workload/", _form(profile="training", gpu_count="8"))
    quote = Quote.objects.get(rank=2)
    assert quote.offer.instance_type == "p4de.24xlarge"
    # Training fixes the work: the quote's hours are an estimate, not filled in as the run time; the buyer sets it.
    nonce = _configure_quote(browser, quote, hours="10")

    # The sandbox is not running here: the provisioning task is enqueued on commit and not run.
    with django_capture_on_commit_callbacks(execute=False):
        response = browser.post("/orders/place", {"nonce": nonce})
        again = browser.post("/orders/place", {"nonce": nonce}, follow=True)

    order = Order.objects.get()
    assert (response.status_code, response["Location"]) == (302, f"/orders/{order.public_id}/")
    assert (order.quote_id, order.offer_id) == (quote.pk, quote.offer_id)
    assert order.price_per_hour == Decimal("27.44705")
    assert order.duration_hours == Decimal("10.00")  # the buyer's, not the quote's estimate
    # The double submit replayed the first order and says so.
    assert f"Order {order.public_id} was already placed from this form." in again.content.decode()
    page = browser.get("/orders/").content.decode()
    assert str(order.public_id)[:8] in page
    assert "p4de.24xlarge" in page


def test_an_expired_or_foreign_quote_is_refused_with_a_message(
    browser, book, charlie, django_capture_on_commit_callbacks
):
    browser.post("/workload/", _form(profile="inference"))
    expired, mine = Quote.objects.order_by("rank")[:2]
    nonce = _configure_quote(browser, expired)
    Quote.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    stranger = Client()
    stranger.force_login(charlie)

    with django_capture_on_commit_callbacks(execute=False):
        late = browser.post("/orders/place", {"nonce": nonce}, follow=True)
    foreign = stranger.get(f"/orders/new?quote={mine.public_id}")

    assert late.redirect_chain == [("/workload/", 302)]
    assert f"Could not place the order: quote {expired.public_id} expired at" in late.content.decode()
    assert foreign.status_code == 404
    assert Order.objects.count() == 0


def test_the_same_offer_in_several_zones_shares_one_row_with_each_zone_orderable(browser, aws_account):
    page = browser.post("/workload/", _form(profile="training", gpu_count="1")).content.decode()

    quotes = list(Quote.objects.order_by("rank"))
    first = quotes[0]

    def kind(q: Quote) -> tuple[object, ...]:
        return q.offer.instance_type, q.offer.region, q.offer.pricing_model, q.price_per_hour

    same = [q for q in quotes[1:] if kind(q) == kind(first)]
    assert same, "the sandbox sells the best offer in more than one zone"
    # One row for them: its own order button, and a link per other zone to that zone's quote
    assert page.count(f"<code>{first.offer.instance_type}</code>") == 1
    assert f"same in {len(same)} more zone" in page
    for q in same:
        assert f'href="/orders/new?quote={q.public_id}" aria-label="Order the same in {q.offer.zone}"' in page
    rows = page.count('aria-label="Order at this price: row ')
    assert rows < len(quotes) and f"{len(quotes)} quotes in {rows} rows" in _text(page)
    # The rows are numbered 1, 2, 3 as shown, not by the first quote's rank in each (1, 4, 7, 10 before).
    numbers = re.findall(r'<td class="row-number">(\d+)</td>', page)
    assert numbers == [str(n) for n in range(1, rows + 1)]
