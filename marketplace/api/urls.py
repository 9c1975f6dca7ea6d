from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from marketplace.api import billing, clusters, invoices, launch, order_actions, views, webhooks

app_name = "api"

urlpatterns = [
    path("schema", SpectacularAPIView.as_view(), name="schema"),
    path("docs", SpectacularSwaggerSplitView.as_view(url_name="api:schema"), name="docs"),
    path("offers", views.OfferListApi.as_view(), name="offers"),
    path("offers/<str:offer_id>", views.OfferDetailApi.as_view(), name="offer"),
    path("offers/<str:offer_id>/prices", views.OfferPricesApi.as_view(), name="offer-prices"),
    path("quotes", views.QuoteCreateApi.as_view(), name="quotes"),
    path("procurements", views.ProcurementCreateApi.as_view(), name="procurements"),
    path("orders", views.OrderListCreateApi.as_view(), name="orders"),
    path("clusters", clusters.ClusterListCreateApi.as_view(), name="clusters"),
    path("clusters/<str:cluster_id>", clusters.ClusterDetailApi.as_view(), name="cluster"),
    path("clusters/<str:cluster_id>/terminate", clusters.ClusterTerminateApi.as_view(), name="cluster-terminate"),
    path("budget", views.BudgetApi.as_view(), name="budget"),
    path("billing", billing.BillingApi.as_view(), name="billing"),
    path("billing/topups", billing.TopUpListCreateApi.as_view(), name="topups"),
    path("billing/topups/<str:topup_id>", billing.TopUpDetailApi.as_view(), name="topup"),
    path("stripe/webhook", billing.StripeWebhookApi.as_view(), name="stripe-webhook"),
    path("invoice", views.InvoiceApi.as_view(), name="invoice"),
    path("invoices", invoices.InvoiceListApi.as_view(), name="invoices"),
    # The file routes first: "<str:number>" would match "INV-2026-000001.pdf" too.
    path("invoices/<str:number>.pdf", invoices.InvoicePdfApi.as_view(), name="invoice-pdf"),
    path("invoices/<str:number>.csv", invoices.InvoiceCsvApi.as_view(), name="invoice-csv"),
    path("invoices/<str:number>", invoices.InvoiceDetailApi.as_view(), name="invoice-issued"),
    path("orders/<str:order_id>", views.OrderDetailApi.as_view(), name="order"),
    path("orders/<str:order_id>/terminate", views.OrderTerminateApi.as_view(), name="order-terminate"),
    path("orders/<str:order_id>/stop", order_actions.OrderStopApi.as_view(), name="order-stop"),
    path("orders/<str:order_id>/start", order_actions.OrderStartApi.as_view(), name="order-start"),
    path("orders/<str:order_id>/restart", order_actions.OrderRestartApi.as_view(), name="order-restart"),
    path("orders/<str:order_id>/logs", order_actions.OrderLogsApi.as_view(), name="order-logs"),
    path("orders/<str:order_id>/receipt", views.OrderReceiptApi.as_view(), name="order-receipt"),
    path("ssh-keys", launch.SshKeyListCreateApi.as_view(), name="ssh-keys"),
    path("ssh-keys/<str:key_id>", launch.SshKeyDetailApi.as_view(), name="ssh-key"),
    path("launch-templates", launch.LaunchTemplateListCreateApi.as_view(), name="launch-templates"),
    path("launch-templates/<str:template_id>", launch.LaunchTemplateDetailApi.as_view(), name="launch-template"),
    path("webhooks", webhooks.WebhookListCreateApi.as_view(), name="webhooks"),
    path("webhooks/<str:webhook_id>", webhooks.WebhookDetailApi.as_view(), name="webhook"),
    path("webhooks/<str:webhook_id>/deliveries", webhooks.WebhookDeliveryListApi.as_view(), name="webhook-deliveries"),
    path(
        "webhooks/<str:webhook_id>/deliveries/<str:delivery_id>/redeliver",
        webhooks.WebhookRedeliverApi.as_view(),
        name="webhook-redeliver",
    ),
    path("webhooks/<str:webhook_id>/ping", webhooks.WebhookPingApi.as_view(), name="webhook-ping"),
    path("webhooks/<str:webhook_id>/secret", webhooks.WebhookSecretRotateApi.as_view(), name="webhook-secret"),
    path("ledger/key", views.LedgerKeyApi.as_view(), name="ledger-key"),
    path("ledger/checkpoints", views.CheckpointListApi.as_view(), name="ledger-checkpoints"),
    path("ledger/checkpoints/latest", views.CheckpointLatestApi.as_view(), name="ledger-checkpoint-latest"),
    path("ledger/consistency", views.ConsistencyApi.as_view(), name="ledger-consistency"),
    path("ledger/leaves", views.LeafHashesApi.as_view(), name="ledger-leaves"),
]
