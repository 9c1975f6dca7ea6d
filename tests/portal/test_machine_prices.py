"""A machine's price falls in the provider portal (issue 39): the seller sets and sees them, with an example in
the machine's own prices; bad values are refused naming the field; nobody else can change them."""

from __future__ import annotations

from decimal import Decimal

import pytest

from marketplace.portal.price_falls import idle_steps, rule_example
from providers.community.pricing import PriceFallRule
from providers.models import Machine, ProviderAccount
from tests.portal.conftest import client_for
from tests.portal.test_machines import LISTING

pytestmark = pytest.mark.django_db
D = Decimal
RULE = {"fragment_discount_pct": "20", "idle_after_hours": "2", "idle_step_pct": "10", "floor_pct": "50"}


@pytest.fixture
def machine(petra) -> Machine:
    client_for(petra).post("/provider/machines/new", {**LISTING, "min_gpus_per_lease": "1"})
    return Machine.objects.get(name="fra-h100-1")


def _url(machine: Machine) -> str:
    return f"/provider/machines/{machine.pk}/prices"


def test_an_operator_sets_the_rule_and_reads_what_it_does(machine, olga):
    client = client_for(olga)
    page = client.get(_url(machine)).content.decode()
    assert "every GPU sells at $1.95, leased or idle" in page  # no rule yet
    assert "8 \u00d7 $2.00: a 3-GPU fragment sells at $1.60; after 2 h idle, \u221210 %/h to $1.00" in page

    saved = client.post(_url(machine), RULE)

    assert saved.status_code == 302 and saved["Location"] == _url(machine)
    machine.refresh_from_db()
    assert machine.price_fall == PriceFallRule(
        fragment_discount_pct=D(20), idle_after_hours=2, idle_step_pct=D(10), floor_pct=D(50)
    )
    account = ProviderAccount.objects.get(pk=machine.account_id)
    assert account.sync_wanted_at is not None  # its offers are built again soon, not at the next round
    page = client.get(_url(machine)).content.decode()
    assert "8 \u00d7 $1.95: a 3-GPU fragment sells at $1.56; after 2 h idle, \u221210 %/h to $0.975" in page
    assert "8 of 8 GPUs free, idle 0 h: its free GPUs sell at $1.95" in page
    assert '>3\u20134 h</td><td class="num">1.7550<' in page  # the idle steps, hour by hour
    listing = client.get("/provider/machines").content.decode()
    assert "fragments \u221220 %; idle after 2 h \u221210 %/h; floor 50 %" in listing


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"fragment_discount_pct": "120"}, "fragment_discount_pct", "percentage from 0 to 100"),
        ({"fragment_discount_pct": "twenty"}, "fragment_discount_pct", "percentage from 0 to 100"),
        ({"idle_step_pct": "-1"}, "idle_step_pct", "percentage from 0 to 100"),
        ({"idle_after_hours": "1.5"}, "idle_after_hours", "whole number of hours"),
        ({"idle_after_hours": "9000"}, "idle_after_hours", "0 to 8784"),
        ({"floor_pct": "12.345"}, "floor_pct", "at most two decimals"),
        ({"floor_pct": "100"}, "floor_pct", "a floor of 100 % keeps the list price"),
    ],
)
def test_a_bad_value_is_refused_on_its_field_and_nothing_is_stored(machine, petra, change, field, words):
    page = client_for(petra).post(_url(machine), {**RULE, **change})

    assert page.status_code == 200
    errors = page.context["form"].errors
    assert list(errors) == [field] and words in errors[field][0], errors
    assert Machine.objects.get(pk=machine.pk).price_fall == PriceFallRule()
    assert ProviderAccount.objects.get(pk=machine.account_id).sync_wanted_at is None


def test_a_viewer_sees_the_rule_and_nobody_else_reaches_it(machine, victor, quentin, alice):
    assert client_for(victor).get(_url(machine)).status_code == 200
    assert client_for(victor).post(_url(machine), RULE).status_code == 403
    for stranger in (quentin, alice):
        assert client_for(stranger).get(_url(machine)).status_code == 404
        assert client_for(stranger).post(_url(machine), RULE).status_code == 404
    assert Machine.objects.get(pk=machine.pk).price_fall == PriceFallRule()


def test_a_slow_fall_is_shown_in_a_few_rows_ending_at_the_floor_and_a_lone_gpu_has_no_fragment():
    slow = PriceFallRule(fragment_discount_pct=D(20), idle_step_pct=D("0.5"), floor_pct=D(80))
    steps = idle_steps(rule=slow, price=D("1.00"), gpus=1, limit=4)
    assert [(s.hours, s.price) for s in steps] == [
        ("under 1 h", D("1.00")),
        ("1\u20132 h", D("0.9950")),
        ("2\u20133 h", D("0.9900")),
        ("3\u20134 h", D("0.9850")),
        ("then down to", D("0.8000")),
    ]
    assert rule_example(rule=slow, price=D("1.00"), gpus=1, divisible=True) == (
        "1 \u00d7 $1.00: after 0 h idle, \u22120.5 %/h to $0.80"
    )
