"""Receipts and the public ledger endpoints: what a buyer or an auditor fetches to check the ledger."""

from __future__ import annotations

from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from ledger import merkle, note
from ledger.canonical import entry_envelope
from ledger.checkpoints import ledger_checkpoint_and_anchor
from marketplace.models import OrderState
from marketplace.orders.services import PlaceRequest, order_place
from tests.leases import LAUNCH, boot_if_launched

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.fixture
def running_order(acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks):
    offer = aws_account.offers.filter(instance_type="g4dn.xlarge", pricing_model="on_demand").order_by("price_usd")[0]
    with django_capture_on_commit_callbacks(execute=True):
        order = order_place(
            organization=acme,
            user=alice,
            request=PlaceRequest(
                launch=LAUNCH, offer_id=offer.pk, max_price_per_hour=offer.price_usd + Decimal("0.01")
            ),
        ).order
    boot_if_launched(order, aws_sandbox)
    assert order.state == OrderState.RUNNING, order.state_reason
    return order


def _leaf(entry: dict) -> bytes:
    envelope = entry_envelope(
        sequence=entry["sequence"],
        kind=entry["kind"],
        subject=entry["subject"],
        created_at=entry["created_at"],
        payload_hash=entry["payload_hash"],
        prev_hash=entry["prev_hash"],
    )
    return merkle.leaf_hash(envelope)


def test_a_receipt_proves_every_entry_of_the_order(api, running_order):
    before = api.get(f"/api/v1/orders/{running_order.public_id}/receipt").json()
    assert before["checkpoint"] is None and before["entries"] == []
    assert [e["kind"] for e in before["pending"]][:2] == ["order.placed", "order.provisioning"]

    ledger_checkpoint_and_anchor()
    body = api.get(f"/api/v1/orders/{running_order.public_id}/receipt").json()

    assert body["format"] == "broker-ledger-receipt/1" and body["pending"] == []
    kinds = [e["kind"] for e in body["entries"]]
    assert kinds[0] == "order.placed" and "attempt.launched" in kinds and kinds[-1] == "order.running"
    checkpoint = body["checkpoint"]
    # The key comes from the public endpoint, as an auditor would fetch it (or better, out of band).
    vkey = APIClient().get("/api/v1/ledger/key").json()["verifier_key"]
    signed = note.open_note(checkpoint["note"], vkey)
    assert (signed.size, signed.root.hex()) == (checkpoint["size"], checkpoint["root"])
    assert checkpoint["anchor"]["tx_hash"].startswith("0x") and checkpoint["anchor"]["block_number"] >= 1
    for entry in body["entries"]:
        leaf = _leaf(entry)
        assert leaf.hex() == entry["leaf_hash"]
        proof = [bytes.fromhex(p) for p in entry["inclusion_proof"]]
        assert merkle.verify_inclusion(leaf, entry["sequence"] - 1, signed.size, proof, signed.root)


def test_a_stranger_gets_no_receipt(running_order, charlie):
    stranger = APIClient()
    stranger.force_authenticate(charlie)
    response = stranger.get(f"/api/v1/orders/{running_order.public_id}/receipt")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert APIClient().get(f"/api/v1/orders/{running_order.public_id}/receipt").status_code in (401, 403)


def test_checkpoints_consistency_and_leaves_are_public(api, running_order, acme, alice):
    anonymous = APIClient()
    assert anonymous.get("/api/v1/ledger/checkpoints/latest").status_code == 404
    first = ledger_checkpoint_and_anchor()
    api.post(f"/api/v1/orders/{running_order.public_id}/terminate")
    second = ledger_checkpoint_and_anchor()
    assert second.size > first.size

    page = anonymous.get("/api/v1/ledger/checkpoints?limit=1").json()
    assert [c["size"] for c in page["checkpoints"]] == [first.size] and page["next_after"] == first.size
    rest = anonymous.get(f"/api/v1/ledger/checkpoints?after={first.size}").json()
    assert [c["size"] for c in rest["checkpoints"]] == [second.size] and rest["next_after"] is None
    assert anonymous.get("/api/v1/ledger/checkpoints/latest").json()["size"] == second.size

    proof = anonymous.get(f"/api/v1/ledger/consistency?old={first.size}&new={second.size}").json()["proof"]
    assert merkle.verify_consistency(
        first.size,
        second.size,
        bytes.fromhex(first.root_hash),
        bytes.fromhex(second.root_hash),
        [bytes.fromhex(p) for p in proof],
    )
    leaves = anonymous.get("/api/v1/ledger/leaves?start=1").json()["leaf_hashes"]
    assert merkle.root_from_hashes([bytes.fromhex(h) for h in leaves[: second.size]]).hex() == second.root_hash


@pytest.mark.parametrize(
    "query, field",
    [("old=0&new=3", "old"), ("new=3", "old"), ("old=2&new=x", "new"), ("old=1&new=999999", None)],
)
def test_bad_consistency_requests_name_what_is_wrong(running_order, query, field):
    ledger_checkpoint_and_anchor()
    response = APIClient().get(f"/api/v1/ledger/consistency?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    if field is None:
        assert error["code"] == "proof_unavailable" and "fewer than 999999" in error["message"]
    else:
        assert field in error["fields"]


def test_the_storefront_receipt_page_shows_the_proofs_to_check(client, alice, charlie, running_order):
    ledger_checkpoint_and_anchor()
    client.force_login(alice)
    page = client.get(f"/orders/{running_order.public_id}/receipt")
    assert page.status_code == 200
    html = page.content.decode()
    assert "order.placed" in html and "receipt.js" in html and 'id="receipt-data"' in html
    assert page.context["receipt"]["checkpoint"]["anchor"]["tx_hash"] in html
    client.force_login(charlie)
    assert client.get(f"/orders/{running_order.public_id}/receipt").status_code == 404


def test_the_receipt_page_of_unsigned_entries_prompts_a_signing(
    alice, running_order, django_capture_on_commit_callbacks
):
    from django.test import Client

    from ledger.models import Checkpoint, LedgerHead

    browser = Client()
    browser.force_login(alice)
    assert not Checkpoint.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        page = browser.get(f"/orders/{running_order.public_id}/receipt")

    assert page.status_code == 200 and page.context["receipt"]["status"] == "pending"
    # The page answered with what was signed then; the signing it queued covers every entry now.
    assert Checkpoint.objects.get().size == LedgerHead.objects.get(id=1).size
