from django.urls import path

from marketplace.web import clusters, launch, team, views, webhooks

app_name = "storefront"

urlpatterns = [
    path("", views.offers, name="offers"),
    path("workload/", views.workload, name="workload"),
    path("offers/<int:offer_id>/prices", views.prices, name="prices"),
    path("compare", views.compare, name="compare"),
    path("spending", views.spending, name="spending"),
    path("spending.csv", views.spending_csv, name="spending-csv"),
    path("orders/", views.orders, name="orders"),
    path("orders/<str:order_id>/", views.order_detail, name="order-detail"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke", views.token_revoke, name="token-revoke"),
    path("webhooks/", webhooks.webhooks, name="webhooks"),
    path("webhooks/<int:webhook_id>/", webhooks.webhook_detail, name="webhook-detail"),
    path("webhooks/<int:webhook_id>/delete", webhooks.webhook_delete, name="webhook-delete"),
    path("webhooks/<int:webhook_id>/ping", webhooks.webhook_ping_view, name="webhook-ping"),
    path("webhooks/<int:webhook_id>/active", webhooks.webhook_active_view, name="webhook-active"),
    path("webhooks/<int:webhook_id>/secret", webhooks.webhook_rotate_view, name="webhook-secret"),
    path(
        "webhooks/<int:webhook_id>/deliveries/<int:delivery_id>/redeliver",
        webhooks.delivery_redeliver,
        name="webhook-redeliver",
    ),
    path("signup", team.signup, name="signup"),
    path("organizations/switch", team.organization_switch, name="organization-switch"),
    path("team/", team.team, name="team"),
    path("team/members/<int:membership_id>", team.member_update, name="member-update"),
    path("team/invitations/<int:invitation_id>/revoke", team.invitation_revoke_view, name="invitation-revoke"),
    path("team/leave", team.leave, name="team-leave"),
    path("invitations/<str:token>", team.invitation, name="invitation"),
    path("orders/new", launch.order_configure, name="order-configure"),
    path("orders/new/confirm", launch.order_confirm, name="order-confirm"),
    path("orders/place", launch.order_place_view, name="order-place"),
    path("keys/", launch.keys, name="keys"),
    path("keys/<str:key_id>/delete", launch.key_delete, name="key-delete"),
    path("templates/", launch.templates, name="templates"),
    path("templates/<str:template_id>/delete", launch.template_delete, name="template-delete"),
    path("orders/<str:order_id>/terminate", views.order_terminate_view, name="order-terminate"),
    path("orders/<str:order_id>/receipt", views.order_receipt, name="order-receipt"),
    path("clusters/<str:cluster_id>/", clusters.cluster_detail, name="cluster-detail"),
    path("clusters/<str:cluster_id>/terminate", clusters.cluster_terminate_view, name="cluster-terminate"),
]
