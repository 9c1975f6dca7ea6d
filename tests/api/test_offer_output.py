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
