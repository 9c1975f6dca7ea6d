"""The broker's URLs plus ``/bench/bare-offers``: the API's offer search without the API.

The bare view runs the same query (``offers_query`` and ``rows_in_order``, same filters, order, columns and page
size) and writes the rows with ``JsonResponse``: no authentication, throttling, DRF request parsing, serializer
or cursor. The API's cost over it is what bench/api.py measures.
"""

from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from django.utils import timezone

from marketplace.api.views import OFFER_COLUMNS, offers_for_output
from marketplace.catalog.query import gpu_partitions, offers_query, rows_in_order

PLAIN = OFFER_COLUMNS


def bare_offers(request: HttpRequest) -> JsonResponse:
    search, sort = request.GET.get("q", ""), request.GET.get("sort", "price")
    offers = offers_for_output(offers_query(search, now=timezone.now(), sort=sort))
    rows = rows_in_order(offers, gpu_partitions(search, sort), int(request.GET.get("limit", "100")))
    results = [{**{c: getattr(o, c) for c in PLAIN}, "provider": o.provider_kind, "gpu_model": o.gpu_model_key}
               for o in rows]  # fmt: skip
    return JsonResponse({"results": results}, encoder=DjangoJSONEncoder)


urlpatterns = [path("bench/bare-offers", bare_offers), path("", include("broker.urls"))]
