"""The offer list's hand-written output equals what DRF's generic serializer writes for the same fields."""

from __future__ import annotations

import pytest
from rest_framework import serializers

from marketplace.api.serializers import OfferOutput
from marketplace.models import Offer

pytestmark = pytest.mark.django_db


def test_the_fast_output_is_the_generic_output(aws_account, tencent_account):
    offers = list(Offer.objects.select_related("account", "gpu_model"))
    assert len(offers) > 20 and {o.currency for o in offers} >= {"USD", "CNY"}
    for offer in offers:
        fast = OfferOutput(offer).data
        generic = serializers.ModelSerializer.to_representation(OfferOutput(), offer)
        assert dict(fast) == dict(generic)
        assert list(fast) == list(OfferOutput.Meta.fields)


def test_a_page_of_offers_is_one_query_and_says_the_same(aws_account, tencent_account):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from marketplace.api.views import offers_for_output
    from marketplace.catalog.query import offers_query

    plain = list(offers_query("", now=timezone.now()))
    with CaptureQueriesContext(connection) as queries:
        lean = list(offers_for_output(offers_query("", now=timezone.now())))
        written = OfferOutput(lean, many=True).data
    assert len(queries.captured_queries) == 1
    assert written == OfferOutput(plain, many=True).data and len(written) > 20
