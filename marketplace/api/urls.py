from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from marketplace.api import views

app_name = "api"

urlpatterns = [
    path("schema", SpectacularAPIView.as_view(), name="schema"),
    path("docs", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
    path("offers", views.OfferListApi.as_view(), name="offers"),
    path("quotes", views.QuoteCreateApi.as_view(), name="quotes"),
    path("procurements", views.ProcurementCreateApi.as_view(), name="procurements"),
    path("orders", views.OrderListCreateApi.as_view(), name="orders"),
    path("budget", views.BudgetApi.as_view(), name="budget"),
    path("invoice", views.InvoiceApi.as_view(), name="invoice"),
    path("orders/<str:order_id>", views.OrderDetailApi.as_view(), name="order"),
    path("orders/<str:order_id>/terminate", views.OrderTerminateApi.as_view(), name="order-terminate"),
    path("orders/<str:order_id>/receipt", views.OrderReceiptApi.as_view(), name="order-receipt"),
    path("ledger/key", views.LedgerKeyApi.as_view(), name="ledger-key"),
    path("ledger/checkpoints", views.CheckpointListApi.as_view(), name="ledger-checkpoints"),
    path("ledger/checkpoints/latest", views.CheckpointLatestApi.as_view(), name="ledger-checkpoint-latest"),
    path("ledger/consistency", views.ConsistencyApi.as_view(), name="ledger-consistency"),
    path("ledger/leaves", views.LeafHashesApi.as_view(), name="ledger-leaves"),
]
