"""The storefront's fleet pages: the list, one fleet with its replicas over time (an inline SVG chart), what it
has cost, its replicas and every decision with its reason; ending it from the page; another organisation's
fleet is not there at all."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from marketplace.fleets.services import fleet_create, fleet_evaluate
from marketplace.models import Fleet, FleetState, Order, OrderState
from tests.marketplace.test_fleets import _data

pytestmark = pytest.mark.django_db


def _fleet_with_a_replica(acme, alice, capture) -> Fleet:
    fleet = fleet_create(organization=acme, user=alice, data=_data(), now=timezone.now()).fleet
    with capture(execute=True):
        fleet_evaluate(fleet_id=fleet.pk)
    return fleet


def test_the_fleet_page_shows_replicas_over_time_cost_replicas_and_each_decision_with_its_reason(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    fleet = _fleet_with_a_replica(acme, alice, django_capture_on_commit_callbacks)
    replica = Order.objects.get(fleet=fleet)
    page = Client()
    page.force_login(alice)

    listed = page.get(reverse("storefront:fleets")).content.decode()
    html = page.get(reverse("storefront:fleet-detail", args=[fleet.public_id])).content.decode()

    assert f'href="/fleets/{fleet.public_id}/">inference</a>' in listed
    assert '1 <span class="muted">of 1 wanted</span>' in listed
    assert '<svg xmlns="http://www.w3.org/2000/svg"' in html and "Replicas over time" in html
    assert "Step chart of the fleet&#x27;s replicas" in html or "Step chart of the fleet's replicas" in html
    assert f"/orders/{replica.public_id}/" in html and replica.offer.instance_type in html
    assert f'<span class="tag {replica.pricing_model}">' in html
    assert "no telemetry from a running replica yet; the minimum is 1" in html
    assert '<span class="tag scale_out">scale out</span>' in html and "0 → 1" in html
    assert '<div class="figure">10<span class="of"> queue_depth per replica</span></div>' in html
    assert 'id="end-form"' in html


def test_the_buyer_ends_a_fleet_from_its_page_and_its_replicas_stop(
    acme, alice, aws_account, aws_sandbox, django_capture_on_commit_callbacks
):
    fleet = _fleet_with_a_replica(acme, alice, django_capture_on_commit_callbacks)
    page = Client()
    page.force_login(alice)

    with django_capture_on_commit_callbacks(execute=True):
        answer = page.post(reverse("storefront:fleet-end", args=[fleet.public_id]))

    assert answer.status_code == 302
    fleet.refresh_from_db()
    assert fleet.state == FleetState.ENDED
    assert set(Order.objects.filter(fleet=fleet).values_list("state", flat=True)) <= {
        OrderState.TERMINATING,
        OrderState.TERMINATED,
        OrderState.CANCELLED,
    }
    after = page.get(reverse("storefront:fleet-detail", args=[fleet.public_id])).content.decode()
    assert 'id="end-form"' not in after and "ended by the buyer from the storefront" in after


def test_another_organisations_fleet_is_not_there(acme, alice, charlie, aws_account, aws_sandbox,
                                                  django_capture_on_commit_callbacks):  # fmt: skip
    fleet = _fleet_with_a_replica(acme, alice, django_capture_on_commit_callbacks)
    page = Client()
    page.force_login(charlie)

    shown = page.get(reverse("storefront:fleet-detail", args=[fleet.public_id]))
    ended = page.post(reverse("storefront:fleet-end", args=[fleet.public_id]))
    listed = page.get(reverse("storefront:fleets")).content.decode()

    assert (shown.status_code, ended.status_code) == (404, 404)
    assert str(fleet.public_id)[:8] not in listed
    fleet.refresh_from_db()
    assert fleet.state == FleetState.ACTIVE
