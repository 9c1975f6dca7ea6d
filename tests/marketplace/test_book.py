"""The double-entry book (issue 22, point 1): balanced entries in integer minor units, derived balances, one
ledger entry per book entry, and refusals that write nothing."""

from __future__ import annotations

import pytest

from ledger.models import LedgerEntry
from ledger.services import ledger_verify
from marketplace.billing.book import MAX_MINOR, BookError, Line, book_account, book_balance, book_check, book_post
from marketplace.models import BookAccountKind, BookEntry, BookLine

pytestmark = pytest.mark.django_db


@pytest.fixture
def accounts(acme):
    return {
        "cash": book_account(kind=BookAccountKind.CASH, currency="USD"),
        "credit": book_account(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=acme),
        "hold": book_account(kind=BookAccountKind.ORDER_HOLD, currency="USD", organization=acme),
        "eur_cash": book_account(kind=BookAccountKind.CASH, currency="EUR"),
        "eur_credit": book_account(kind=BookAccountKind.BUYER_CREDIT, currency="EUR", organization=acme),
    }


def _top_up(accounts, cents: int, key: str = "pi_1"):
    # A card top-up: the platform holds the cash (debit), the buyer's credit is owed to them (credit).
    return book_post(
        kind="top_up",
        key=key,
        lines=[Line(accounts["cash"], cents), Line(accounts["credit"], -cents)],
    )


def test_a_top_up_and_a_hold_move_money_and_balances_are_the_sums_of_lines(accounts):
    _top_up(accounts, 5000)
    book_post(kind="hold", key="ord-1-h1", lines=[Line(accounts["credit"], 1200), Line(accounts["hold"], -1200)])

    assert book_balance(accounts["cash"]) == 5000
    assert book_balance(accounts["credit"]) == -3800  # credit side: $38.00 still spendable
    assert book_balance(accounts["hold"]) == -1200
    assert book_check() == {"USD": 0}
    assert LedgerEntry.objects.filter(kind="book.entry").count() == 2
    assert ledger_verify().ok


def test_posting_the_same_key_twice_returns_the_first_entry_and_moves_nothing_more(accounts):
    first = _top_up(accounts, 5000)
    again = _top_up(accounts, 5000)

    assert again.pk == first.pk
    assert BookEntry.objects.count() == 1 and book_balance(accounts["cash"]) == 5000
    with pytest.raises(BookError, match="already posted with other lines"):
        _top_up(accounts, 6000)


@pytest.mark.parametrize(
    ("amounts", "message"),
    [
        ((5000, -4999), r"do not balance: they sum to \+1 USD"),
        ((5000,), "at least two lines"),
        ((0, 0), "non-zero"),
        ((MAX_MINOR + 1, -(MAX_MINOR + 1)), "at most"),
        ((50.0, -50.0), "whole number of minor units"),
        ((True, -1), "whole number of minor units"),
    ],
)
def test_a_bad_entry_is_refused_naming_what_is_wrong_and_nothing_is_written(accounts, amounts, message):
    holders = [accounts["cash"], accounts["credit"]]
    lines = [Line(holders[i], amount) for i, amount in enumerate(amounts)]

    with pytest.raises(BookError, match=message):
        book_post(kind="top_up", key="bad", lines=lines)

    assert (BookEntry.objects.count(), BookLine.objects.count()) == (0, 0)
    assert not LedgerEntry.objects.filter(kind="book.entry").exists()


def test_each_currency_balances_on_its_own(accounts):
    mixed = [Line(accounts["cash"], 1000), Line(accounts["eur_credit"], -1000)]

    with pytest.raises(BookError, match=r"sum to -1000 EUR, \+1000 USD"):
        book_post(kind="top_up", key="mixed", lines=mixed)

    book_post(kind="top_up", key="eur", lines=[Line(accounts["eur_cash"], 900), Line(accounts["eur_credit"], -900)])
    assert book_check() == {"EUR": 0}


def test_entries_and_lines_are_written_once(accounts):
    entry = _top_up(accounts, 5000)
    line = entry.lines.first()

    with pytest.raises(Exception, match=r"append-only|refuse|changing"):
        line.amount_minor = 1
        line.save()
    with pytest.raises(Exception, match=r"append-only|refuse|update"):
        BookLine.objects.filter(pk=line.pk).update(amount_minor=1)
    assert book_balance(accounts["cash"]) == 5000


@pytest.mark.parametrize("currency", ["usd", "US", "USDT", "U$D", ""])
def test_an_account_currency_is_three_upper_case_letters(acme, currency):
    with pytest.raises(BookError, match="ISO 4217"):
        book_account(kind=BookAccountKind.BUYER_CREDIT, currency=currency, organization=acme)


def test_one_account_per_kind_owner_and_currency(acme):
    first = book_account(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=acme)
    assert book_account(kind=BookAccountKind.BUYER_CREDIT, currency="USD", organization=acme).pk == first.pk
    house = book_account(kind=BookAccountKind.REVENUE, currency="USD")
    assert book_account(kind=BookAccountKind.REVENUE, currency="USD").pk == house.pk != first.pk
