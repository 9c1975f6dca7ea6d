"""Numbers nobody types, refused naming the field and its range, never a 500 and never a long computation
(issue 17, item 2).

``count<1e1000000`` in a search made the database layer turn the Decimal into an int, holding the process for
about a minute. Each numeric input the API, the storefront, the portal and the client's command line take is
run here with huge exponents, NaN, infinities, negative zero, 400-digit integers and digits Python's ``int``
reads but nobody types (Arabic-Indic, fullwidth). The project has no pytest-timeout: each request runs in a
thread joined with a generous bound, so a freeze fails the test instead of hanging CI."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from brokerclient import cli
from django.db import connections
from rest_framework.test import APIClient

from marketplace.api import pagination
from marketplace.models import Order
from marketplace.portal.clouds import CloudField
from marketplace.portal.forms import MachineForm, _number
from marketplace.web.forms import BudgetForm, LaunchForm, OfferFilterForm, WorkloadForm

# As text: for query strings, form posts and JSON strings.
TEXTS = [
    "1e1000000", "-1e1000000", "1E+999999999", "NaN", "Infinity", "-Infinity", "-0", "9" * 400,
    "\u0661\u0662",  # Arabic-Indic 12
    "\uff11\uff12",  # fullwidth 12
    "1e309",
]  # fmt: skip
# As JSON number literals: Python's json reads 1e309 as inf and a 400-digit integer exactly. (-0 is not here: as
# a JSON number it is the value 0, in range wherever 0 is.)
OVERFLOWING = ["1e309", "-1e309", "1e1000000"]
LITERALS = [*OVERFLOWING, "9" * 400]

FREEZE_BOUND_S = 30.0  # a refusal takes milliseconds; the conversion it prevents took about a minute


def _bounded(call: Callable[[], Any]) -> Any:
    """``call()`` in a thread; fails if it has not returned within ``FREEZE_BOUND_S``. The thread uses the
    test's database connection (as Django's live server thread does), so it sees the test's uncommitted rows."""
    result: dict[str, Any] = {}
    connection = connections["default"]

    def run() -> None:
        connections["default"] = connection
        try:
            result["value"] = call()
        except BaseException as exc:  # re-raised below, in the test's thread
            result["error"] = exc

    connection.inc_thread_sharing()
    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(FREEZE_BOUND_S)
    finally:
        connection.dec_thread_sharing()
    assert not thread.is_alive(), f"still computing after {FREEZE_BOUND_S} s"
    if "error" in result:
        raise result["error"]
    return result["value"]


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


def _refused(response: Any, field: str, range_text: str | None = None) -> None:
    assert response.status_code == 400, (response.status_code, response.content[:300])
    error = response.json()["error"]
    assert field in error.get("fields", {}), error
    if range_text is not None:
        assert range_text in json.dumps(error["fields"][field]), error


# --- The query language --------------------------------------------------------------------------------------

QUERY_FIELDS = {"count": "0 to 1024", "mem": "0 to 16384", "price": "0 to 1000000", "gpuprice": "0 to 1000000",
                "reliability": "0 to 1"}  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("value", TEXTS)
@pytest.mark.parametrize("field", list(QUERY_FIELDS))
@pytest.mark.parametrize("op", ["<", ">=", "="])
def test_a_search_term_with_an_absurd_number_is_refused_naming_its_range(api, field, op, value):
    response = _bounded(lambda: api.get("/api/v1/offers", {"q": f"{field}{op}{value}"}))

    _refused(response, "q", QUERY_FIELDS[field])


@pytest.mark.django_db
def test_the_storefront_search_box_refuses_a_huge_exponent(client, alice):
    client.force_login(alice)

    response = _bounded(lambda: client.get("/", {"q": "count<1e1000000"}))

    assert response.status_code == 200
    assert b"count compares with a number from 0 to 1024" in response.content


# --- API query parameters and cursors ------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("value", TEXTS)
@pytest.mark.parametrize("field", ["count", "max_price"])
def test_an_offer_filter_with_an_absurd_number_is_refused(api, field, value):
    _refused(_bounded(lambda: api.get("/api/v1/offers", {field: value})), field)


@pytest.mark.django_db
@pytest.mark.parametrize("value", TEXTS)
def test_an_absurd_days_of_offer_prices_is_refused(api, aws_account, value):
    offer = aws_account.offers.first()

    response = _bounded(lambda: api.get(f"/api/v1/offers/{offer.pk}/prices", {"days": value}))

    _refused(response, "days", "from 1 to 365")


@pytest.mark.django_db
@pytest.mark.parametrize("value", [t for t in TEXTS if t != "-0"])  # -0 is a price a cursor may carry
@pytest.mark.parametrize("sort", ["price", "gpuprice"])
def test_a_forged_cursor_with_an_absurd_key_is_refused(api, sort, value):
    tag = pagination.listing_tag("offers", "", sort, [])
    cursor = base64.urlsafe_b64encode(json.dumps({"t": tag, "v": [value, "1"]}).encode()).decode().rstrip("=")

    response = _bounded(lambda: api.get("/api/v1/offers", {"sort": sort, "cursor": cursor}))

    _refused(response, "cursor")


@pytest.mark.django_db
@pytest.mark.parametrize("value", [*(t for t in TEXTS if t != "-0"), "99999999999999999999"])
def test_a_forged_cursor_with_an_absurd_id_is_refused(api, value):
    cursor = base64.urlsafe_b64encode(
        json.dumps({"t": pagination.listing_tag("orders"), "v": [value]}).encode()
    ).decode()

    _refused(_bounded(lambda: api.get("/api/v1/orders", {"cursor": cursor})), "cursor")


# --- API bodies ------------------------------------------------------------------------------------------------

QUOTE_FIELDS = [
    "gpu_count", "total_gpu_memory_gb", "min_gpu_memory_gb", "max_price_per_hour", "max_price_per_job",
    "duration_hours", "checkpoint_interval_hours", "min_interconnect_gbs", "min_fp64_tflops", "min_video_encoders",
    "limit",
]  # fmt: skip


def _post(api: APIClient, path: str, body: str, method: str = "POST") -> Any:
    return _bounded(lambda: api.generic(method, path, body.encode(), content_type="application/json"))


def _as_string(value: str) -> str:
    return json.dumps(value)


@pytest.mark.django_db
@pytest.mark.parametrize("value", [*map(_as_string, TEXTS), *LITERALS])
@pytest.mark.parametrize("field", QUOTE_FIELDS)
def test_a_quote_with_an_absurd_number_is_refused_naming_the_field(api, field, value):
    response = _post(api, "/api/v1/quotes", f'{{"profile": "inference", "{field}": {value}}}')

    _refused(response, field)


@pytest.mark.django_db
@pytest.mark.parametrize("value", [*map(_as_string, TEXTS), *LITERALS])
def test_a_procurement_time_limit_out_of_range_is_refused(api, value):
    response = _post(api, "/api/v1/procurements", f'{{"demands": [{{"profile": "inference"}}], "time_limit": {value}}}')

    _refused(response, "time_limit", "a number from 0.5 to ")


@pytest.mark.django_db
@pytest.mark.parametrize("value", [*map(_as_string, TEXTS), *LITERALS])
@pytest.mark.parametrize("field", ["offer", "max_price_per_hour", "duration_hours", "bid_per_gpu_hour"])
def test_an_order_with_an_absurd_number_is_refused_naming_the_field(api, field, value):
    other = {"offer": '"quote": "00000000-0000-0000-0000-000000000000"'}.get(field, '"offer": 1')

    response = _post(api, "/api/v1/orders", f'{{{other}, "{field}": {value}}}')

    _refused(response, field)
    assert not Order.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("value", [*map(_as_string, TEXTS), *LITERALS])
@pytest.mark.parametrize("field", ["disk_gb", "spend_cap_usd"])
def test_a_launch_configuration_with_an_absurd_number_is_refused_naming_the_field(api, aws_account, field, value):
    offer = aws_account.offers.first()

    response = _post(api, "/api/v1/orders", f'{{"offer": {offer.pk}, "launch": {{"{field}": {value}}}}}')

    # DRF's JSONField refuses an infinity anywhere in its value, naming the whole launch configuration.
    _refused(response, "launch" if value in OVERFLOWING else f"launch.{field}")
    assert not Order.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("value", [*map(_as_string, TEXTS), *LITERALS])
def test_a_launch_port_out_of_range_is_refused(api, aws_account, value):
    offer = aws_account.offers.first()

    response = _post(api, "/api/v1/orders", f'{{"offer": {offer.pk}, "launch": {{"ports": [{value}]}}}}')

    _refused(response, "launch" if value in OVERFLOWING else "launch.ports[0]")


@pytest.mark.django_db
@pytest.mark.parametrize("value", [*map(_as_string, TEXTS), *LITERALS])
@pytest.mark.parametrize("field", ["budget_per_hour", "budget_monthly"])
def test_a_budget_with_an_absurd_number_is_refused_naming_the_field(api, field, value):
    other = "budget_monthly" if field == "budget_per_hour" else "budget_per_hour"

    response = _post(api, "/api/v1/budget", f'{{"{other}": null, "{field}": {value}}}', method="PUT")

    _refused(response, field)


# --- Storefront and portal forms -------------------------------------------------------------------------------

FORMS: list[tuple[str, Callable[[dict[str, str]], Any], dict[str, str], list[str]]] = [
    ("offer filter", lambda data: OfferFilterForm(data), {}, ["count", "max_price"]),
    ("workload", lambda data: WorkloadForm(data), {"profile": "inference", "interruption_tolerance": "none",
     "duration_hours": "8"}, ["gpu_count", "total_gpu_memory_gb", "duration_hours", "max_price_per_hour"]),
    ("budget", lambda data: BudgetForm(data), {}, ["budget_per_hour", "budget_monthly"]),
    ("launch", lambda data: LaunchForm(data, keys=[]), {"workload_kind": "none", "access": "mine"},
     ["duration_hours", "spend_cap_usd", "shm_size_gb", "disk_gb", "max_price_per_hour"]),
    ("machine", lambda data: MachineForm(data, gpu_models=[("H100-80GB", 80)]), {}, [
        "gpu_count", "gpu_memory_gb", "vcpus", "memory_gib", "disk_gb", "network_gbps", "price_per_gpu_hour",
        "min_bid_per_gpu_hour"]),
]  # fmt: skip
FORM_CASES = [(name, make, base, field) for name, make, base, fields in FORMS for field in fields]


@pytest.mark.django_db
@pytest.mark.parametrize("value", TEXTS)
@pytest.mark.parametrize(("name", "make", "base", "field"), FORM_CASES, ids=[f"{c[0]}-{c[3]}" for c in FORM_CASES])
def test_a_form_refuses_an_absurd_number_naming_the_field_and_its_range(name, make, base, field, value):
    form = make({**base, field: value})

    assert not _bounded(form.is_valid)
    assert field in form.errors, form.errors
    assert "from " in form.errors[field][0] or "number" in form.errors[field][0], form.errors[field]


@pytest.mark.parametrize("value", [t for t in TEXTS if t != "-0"])  # an unbounded option may be negative
@pytest.mark.parametrize("kind", ["number", "integer"])
def test_a_cloud_option_refuses_an_absurd_number(kind, value):
    from django import forms

    spec = CloudField("quota", "Quota", kind=kind)  # no stated bounds: the option still gets some

    with pytest.raises(forms.ValidationError):
        _bounded(lambda: _number(spec, value))


def test_a_cloud_option_in_range_is_kept():
    assert _number(CloudField("q", "Q", kind="integer", min_value=1, max_value=10), "8") == "8"
    assert _number(CloudField("q", "Q", kind="number", min_value=0, max_value=1), "0.5") == "0.5"


# --- The client's command line --------------------------------------------------------------------------------

CLI_ARGS = [
    ["offers", "--limit"], ["quote", "--profile", "inference", "--count"], ["quote", "--profile", "inference",
    "--hours"], ["quote", "--profile", "inference", "--min-fp64"], ["order", "--offer"], ["watch", "o", "--wait"],
    ["watch", "o", "--interval"], ["launch", "--gpu", "H100", "--disk"], ["launch", "--gpu", "H100", "--shm"],
    ["offers", "--timeout"], ["offers", "--retries"],
]  # fmt: skip


@pytest.mark.parametrize("value", TEXTS)
@pytest.mark.parametrize("args", CLI_ARGS, ids=[" ".join(a) for a in CLI_ARGS])
def test_the_cli_refuses_an_absurd_number_naming_the_option(args, value, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.parser().parse_args([*args, value])

    assert exited.value.code == 2
    assert f"argument {args[-1]}" in capsys.readouterr().err


def test_the_cli_takes_plain_numbers():
    args = cli.parser().parse_args(["quote", "--profile", "inference", "--count", "8", "--hours", "1.5"])

    assert (args.count, args.hours) == (8, 1.5)


@pytest.mark.parametrize("value", [*TEXTS, "0", "65536"])
def test_a_launch_port_in_the_cli_is_checked(value):
    args = cli.parser().parse_args(["launch", "--gpu", "H100", "--port", f"8000,{value}"])

    with pytest.raises(cli.UsageError, match="--port: a whole number from 1 to 65535"):
        cli.launch_config_from(args)
