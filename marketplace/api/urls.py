from django.urls import path

from marketplace.api import views

app_name = "api"

urlpatterns = [
    path("offers", views.OfferListApi.as_view(), name="offers"),
    path("quotes", views.QuoteCreateApi.as_view(), name="quotes"),
    path("procurements", views.ProcurementCreateApi.as_view(), name="procurements"),
    path("orders", views.OrderListCreateApi.as_view(), name="orders"),
    path("budget", views.BudgetApi.as_view(), name="budget"),
    path("invoice", views.InvoiceApi.as_view(), name="invoice"),
    path("orders/<str:order_id>", views.OrderDetailApi.as_view(), name="order"),
    path("orders/<str:order_id>/terminate", views.OrderTerminateApi.as_view(), name="order-terminate"),
]
