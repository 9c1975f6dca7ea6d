"""The library against a live broker: paging through offers, and a workload's whole life (quote, order, watch
it run, terminate, fetch and verify its receipt), including receipts that were tampered with."""

from __future__ import annotations

import copy
import uuid

import pytest
from brokerclient import BrokerClient, ReceiptInvalid, verify_receipt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ledger import note
from ledger.checkpoints import ledger_checkpoint_and_anchor
from ledger.keys import verifier_key
from marketplace.models import Offer, Order, OrderState

pytestmark = pytest.mark.django_db(transaction=True)


def test_offers_follow_the_cursor_through_every_page(broker, aws_account):
    everything = list(broker.offers("gpu=T4", sort="gpuprice", page_size=500))
    paged = list(broker.offers("gpu=T4", sort="gpuprice", page_size=3))

    expected = Offer.objects.filter(gpu_model__key="T4", status="available").count()
    assert len(everything) == expected and expected > 6  # more than two pages of three
    assert [o["id"] for o in paged] == [o["id"] for o in everything]
    assert len({o["id"] for o in paged}) == expected
    per_gpu = [float(o["price_per_gpu_hour_usd"]) for o in paged]
    assert per_gpu == sorted(per_gpu)
    assert [o["id"] for o in broker.offers("gpu=T4", sort="gpuprice", limit=4, page_size=3)] == [
        o["id"] for o in everything[:4]
    ]
    cheapest = everything[0]
    assert broker.offer(cheapest["id"]) == cheapest
    (price,) = broker.offer_prices(cheapest["id"], days=7)  # one price since it was first seen
    assert price["price_usd"] == cheapest["price_usd"]


def _journey(broker: BrokerClient) -> tuple[dict, list[dict], dict]:
    """Quote a one-T4 inference workload, order the best quote, watch it run, terminate it; returns the order
    as placed, the states watched, and the order once terminated."""
    quoted = broker.quote(
        {"profile": "inference", "gpu_count": 1, "gpu_models": ["T4"], "pricing_models": ["on_demand"]}
    )
    assert quoted["quotes"], quoted
    best = quoted["quotes"][0]
    placed = broker.order(quote=best["id"], max_price_per_hour=best["price_per_hour"])
    seen = list(broker.watch(placed["id"], until=["running"], timeout=60, interval=0.2))
    terminated = broker.terminate(placed["id"])
    return placed, seen, terminated


def test_quote_order_watch_terminate_and_verify_the_receipt(broker, aws_account):
    placed, seen, terminated = _journey(broker)

    order = Order.objects.get()
    assert placed["id"] == str(order.public_id) and placed["quote"] == str(order.quote.public_id)
    assert seen[-1]["state"] == OrderState.RUNNING and seen[-1]["instance"]["provider_instance_id"]
    assert terminated["state"] in (OrderState.TERMINATING, OrderState.TERMINATED)
    final = list(broker.watch(placed["id"], until=["terminated"], timeout=60, interval=0.2))
    assert final[-1]["state"] == OrderState.TERMINATED

    before = broker.receipt(placed["id"])
    unproven = verify_receipt(before, trusted_key=verifier_key(), order_id=placed["id"])
    assert not unproven.ok and before["entries"] == [] and unproven.pending_entries == len(before["pending"])

    ledger_checkpoint_and_anchor()
    receipt = broker.receipt(placed["id"])
    # The key comes from the broker's own configuration, standing in for one obtained out of band.
    result = broker.verify_receipt(receipt, trusted_key=verifier_key(), order_id=placed["id"])

    assert result.ok, result.text()
    assert result.key_pinned and result.verified_entries == len(receipt["entries"]) and result.pending_entries == 0
    kinds = [e["kind"] for e in receipt["entries"]]
    assert kinds[0] == "order.placed" and "order.running" in kinds and kinds[-1] == "order.terminated"
    assert [c.name for c in result.checks if c.entry is None] == ["key", "signature"]
    unpinned = broker.verify_receipt(receipt)
    assert unpinned.ok and not unpinned.key_pinned and "not pinned" in unpinned.summary()


def _failures(receipt: dict, **kwargs) -> list[tuple[str, int | None]]:
    result = verify_receipt(receipt, **kwargs)
    assert not result.ok
    with pytest.raises(ReceiptInvalid) as raised:
        result.raise_if_failed()
    assert raised.value.failures == result.failures
    return [(c.name, c.entry) for c in result.failures]


def test_a_tampered_receipt_fails_naming_the_check_and_the_entry(broker, aws_account):
    placed, _, _ = _journey(broker)
    ledger_checkpoint_and_anchor()
    receipt = broker.receipt(placed["id"])
    key = verifier_key()
    assert verify_receipt(receipt, trusted_key=key).ok
    first, second = receipt["entries"][0]["sequence"], receipt["entries"][1]["sequence"]

    # One entry's payload changed: its payload no longer hashes to what the ledger recorded.
    payload = copy.deepcopy(receipt)
    payload["entries"][0]["payload"] = payload["entries"][0]["payload"].replace('"placed"', '"running"', 1)
    assert payload["entries"][0]["payload"] != receipt["entries"][0]["payload"]
    assert _failures(payload, trusted_key=key) == [("payload", first)]

    # The payload and its hash changed together: the leaf recomputed from the fields is no longer the ledger's.
    rehashed = copy.deepcopy(receipt)
    rehashed["entries"][0]["payload_hash"] = "0" * 64
    assert ("leaf", first) in _failures(rehashed, trusted_key=key)

    # One hash of one inclusion proof changed.
    proof = copy.deepcopy(receipt)
    path = proof["entries"][1]["inclusion_proof"]
    path[0] = ("1" if path[0][0] != "1" else "2") + path[0][1:]
    assert _failures(proof, trusted_key=key) == [("inclusion", second)]

    # A key we did not pin: the checkpoint carries no signature by it.
    stranger = note.verifier_key(receipt["origin"], Ed25519PrivateKey.generate().public_key())
    assert _failures(receipt, trusted_key=stranger) == [("signature", None)]
    # A receipt naming another key: unpinned, that key is used and fails; pinned, the pinned key decides.
    renamed = copy.deepcopy(receipt)
    renamed["verifier_key"] = stranger
    assert _failures(renamed) == [("signature", None)]
    assert verify_receipt(renamed, trusted_key=key).ok

    # The stated checkpoint disagrees with the note that was signed.
    root = copy.deepcopy(receipt)
    root["checkpoint"]["root"] = "ab" * 32
    assert _failures(root, trusted_key=key) == [("checkpoint", None)]

    # Another order's receipt, however valid, is not this order's.
    assert _failures(receipt, trusted_key=key, order_id=str(uuid.uuid4())) == [("subject", None)]
