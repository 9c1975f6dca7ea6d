"""EU VAT ids and the reverse charge (issue 35, point 6).

A VAT id is checked offline for each member state's format and check digits (python-stdnum; no VIES call). The rule,
from Council Directive 2006/112/EC (https://eur-lex.europa.eu/legal-content/EN/ALL/?uri=CELEX:32006L0112): a
service to a business is supplied where the business is (Article 44) and the business accounts for the VAT
(Article 196), so the invoice charges none, shows both VAT ids (Article 226(3), (4)) and says "Reverse charge"
(Article 226(11a)); a buyer in the supplier's own member state pays that state's VAT. Greece's VAT ids begin EL
(the Commission's VIES country list, https://taxation-customs.ec.europa.eu/vies).
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from marketplace.billing.book import book_account_balance
from marketplace.billing.credit import order_settle
from marketplace.billing.invoices import invoice_draft
from marketplace.billing.payments import order_refund
from marketplace.billing.vat_ids import VatIdInvalid, reverse_charge_applies, vat_id_parse
from marketplace.models import BillingProfile, BookAccountKind, BookEntry
from tests.marketplace.test_invoices import IN_OCTOBER, OCTOBER, _ended_order

pytestmark = pytest.mark.django_db

# One valid VAT id per member state (check digits correct), as published in python-stdnum's documentation.
VALID = {
    "AT": "ATU13585627", "BE": "BE0403019261", "BG": "BG175074752", "CY": "CY10259033P", "CZ": "CZ25123891",
    "DE": "DE136695976", "DK": "DK13585628", "EE": "EE100931558", "ES": "ESA13585625", "FI": "FI20774740",
    "FR": "FR40303265045", "GR": "EL094259216", "HR": "HR33392005961", "HU": "HU12892312", "IE": "IE6388047V",
    "IT": "IT00743110157", "LT": "LT119511515", "LU": "LU15027442", "LV": "LV40003521600", "MT": "MT11679112",
    "NL": "NL004495445B01", "PL": "PL8567346215", "PT": "PT501964843", "RO": "RO18547290",
    "SE": "SE123456789701", "SI": "SI50223054", "SK": "SK2022749619",
}  # fmt: skip


@pytest.mark.parametrize("country", sorted(VALID))
def test_every_member_states_vat_id_passes_and_a_changed_digit_fails(country):
    number = VALID[country]
    assert vat_id_parse(number, country).number == number
    spaced = " ".join([number[:4], number[4:8], number[8:]])
    assert vat_id_parse(spaced.lower(), country).number == number  # spaces and case do not matter
    at = number.index("B", 2) - 1 if country == "NL" else len(number) - 1  # NL's B01 suffix has no check digit
    digit = number[at]
    swapped = str((int(digit) + 1) % 10) if digit.isdigit() else ("A" if digit != "A" else "B")
    changed = number[:at] + swapped + number[at + 1 :]
    with pytest.raises(VatIdInvalid):
        vat_id_parse(changed, country)


@pytest.mark.parametrize(
    ("text", "country", "says"),
    [
        ("DE136695977", "DE", "check digits are wrong"),
        ("DE13669597", "DE", "wrong number of characters"),
        ("FR40303265045", "DE", "a VAT id of DE begins DE, not FR"),
        ("GB123456789", "GB", "not an EU member state"),
        ("DE\u0661\u0663\u0666\u0666\u0669\u0665\u0669\u0667\u0666", "DE", "plain letters and digits"),
        ("DE13669597!", "DE", "letters and digits only"),
    ],
)
def test_a_bad_vat_id_is_refused_naming_what_is_wrong(text, country, says):
    with pytest.raises(VatIdInvalid, match=says):
        vat_id_parse(text, country)


def test_the_prefix_may_be_left_off_and_greece_is_el():
    assert vat_id_parse("136695976", "DE").number == "DE136695976"
    assert vat_id_parse("GR094259216", "GR").number == "EL094259216"
    assert vat_id_parse("U13585627", "AT").number == "ATU13585627"


def test_reverse_charge_applies_only_across_member_states_with_a_valid_id():
    assert reverse_charge_applies(buyer_country="DE", buyer_vat_id="DE136695976", supplier_country="IE")
    assert reverse_charge_applies(buyer_country="DE", buyer_vat_id="DE136695976", supplier_country="")  # outside EU
    assert not reverse_charge_applies(buyer_country="DE", buyer_vat_id="DE136695976", supplier_country="DE")
    assert not reverse_charge_applies(buyer_country="DE", buyer_vat_id="", supplier_country="IE")
    assert not reverse_charge_applies(buyer_country="DE", buyer_vat_id="DE136695977", supplier_country="IE")
    assert not reverse_charge_applies(buyer_country="GB", buyer_vat_id="GB123456789", supplier_country="IE")


def _settled(organization, user):
    order, line = _ended_order(organization, user, seconds=7200, at=IN_OCTOBER)  # 2 h at $1.006/h: 201 cents
    order_settle(order, line, now=IN_OCTOBER)
    return BookEntry.objects.get(kind="order.charge", order=order)


def test_a_business_in_another_member_state_is_invoiced_without_vat_and_told_why(acme, alice, settings):
    settings.BROKER_COUNTRY, settings.BROKER_TAX_ID = "IE", "IE6388047V"
    BillingProfile.objects.create(organization=acme, country="DE", tax_id="DE136695976")

    charge = _settled(acme, alice)

    assert charge.memo == "tax DE VAT 0 reverse-charge"
    assert sum(line.amount_minor for line in charge.lines.filter(account__kind="buyer_credit")) == 201
    assert not charge.lines.filter(account__kind="tax_payable").exists()
    draft = invoice_draft(acme, OCTOBER)
    assert [(t.country, t.name, t.rate, t.net_minor, t.tax_minor) for t in draft.tax_lines] == [
        ("DE", "VAT", 0, 201, 0)
    ]
    assert draft.total_minor == 201
    assert draft.tax_note.startswith("Reverse charge") and "Article" in draft.tax_note
    assert draft.buyer["tax_id"] == "DE136695976" and draft.seller["tax_id"] == "IE6388047V"


def test_a_business_in_the_brokers_own_member_state_pays_its_vat(acme, alice, settings):
    settings.BROKER_COUNTRY = "DE"
    BillingProfile.objects.create(organization=acme, country="DE", tax_id="DE136695976")

    charge = _settled(acme, alice)

    assert charge.memo == "tax DE VAT 0.19"
    assert invoice_draft(acme, OCTOBER).tax_minor == 38  # 19 % of 201, half up
    assert "Reverse charge" not in invoice_draft(acme, OCTOBER).tax_note


@pytest.mark.parametrize("tax_id", ["", "DE136695977"])
def test_a_buyer_without_a_valid_vat_id_pays_vat_as_a_consumer(acme, alice, settings, tax_id):
    settings.BROKER_COUNTRY = "IE"
    BillingProfile.objects.create(organization=acme, country="DE", tax_id=tax_id)  # a stored id from before checks

    assert _settled(acme, alice).memo == "tax DE VAT 0.19"


def test_the_api_and_the_billing_page_refuse_a_bad_vat_id_and_keep_a_good_one_compact(acme, alice):
    api = APIClient()
    api.force_authenticate(alice)
    put = lambda body: api.put("/api/v1/billing", data=json.dumps(body), content_type="application/json")  # noqa: E731

    refused = put({"country": "DE", "tax_id": "DE 136 695 977"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "tax_id_invalid"
    assert "check digits are wrong" in refused.json()["error"]["message"]
    assert not BillingProfile.objects.filter(organization=acme, country="DE").exists()  # nothing half-saved
    assert put({"country": "DE", "tax_id": "de 136.695.976"}).json()["tax_id"] == "DE136695976"
    moved = put({"country": "FR"})  # the id kept is Germany's: it is no French VAT id
    assert moved.status_code == 400 and "begins FR, not DE" in moved.json()["error"]["message"]

    page = Client()
    page.force_login(alice)
    answer = page.post("/billing/", {"action": "profile", "country": "AT", "tax_id": "ATU13585628"})
    assert answer.status_code == 400 and "check digits are wrong" in answer.content.decode()
    assert page.post("/billing/", {"action": "profile", "country": "AT", "tax_id": "u 13585627"}).status_code == 302
    assert BillingProfile.objects.get(organization=acme).tax_id == "ATU13585627"


def test_a_refund_gives_back_its_share_of_the_tax_and_the_invoice_says_so(acme, alice):
    BillingProfile.objects.create(organization=acme, country="GB")
    order, line = _ended_order(acme, alice, seconds=36000, at=IN_OCTOBER)  # 10 h at $1.006/h: 1006 + 20 % VAT
    order_settle(order, line, now=IN_OCTOBER)
    order_refund(order=order, amount_minor=600, key="part", reason="slow disk")  # this month, not October's

    october, now = invoice_draft(acme, OCTOBER), invoice_draft(acme, timezone.now().strftime("%Y-%m"))

    [charge] = october.lines
    assert (charge.net_minor, charge.tax_minor) == (1006, 201)
    [credit] = now.lines
    # 600 = 500 + 100 of VAT given back, named as the October charge named it.
    assert (credit.net_minor, credit.tax_minor, credit.tax_country, credit.tax_name) == (-500, -100, "GB", "VAT")
    assert [(t.country, t.net_minor, t.tax_minor) for t in now.tax_lines] == [("GB", -500, -100)]
    assert now.total_minor == -600 == now.subtotal_minor + now.tax_minor
    assert (
        october.tax_minor + now.tax_minor
        == 101
        == -book_account_balance(kind=BookAccountKind.TAX_PAYABLE, currency="USD")
    )


@pytest.mark.parametrize("country", ["XX", "", "gb", "GBR", 7])
def test_the_api_refuses_a_billing_country_that_is_no_iso_code(acme, alice, country):
    api = APIClient()
    api.force_authenticate(alice)

    answer = api.put("/api/v1/billing", data=json.dumps({"country": country}), content_type="application/json")

    # "XX" was taken before: any two capitals passed.
    assert answer.status_code == 400 and "country" in answer.json()["error"]["fields"]
    assert not BillingProfile.objects.filter(organization=acme).exclude(country="").exists()
