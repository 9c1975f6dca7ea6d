from django.urls import path

from marketplace.portal import payouts, views

app_name = "portal"

urlpatterns = [
    path("", views.home, name="home"),
    path("signup", views.signup, name="signup"),
    path("details", views.details, name="details"),
    path("terms", views.terms, name="terms"),
    path("team", views.team, name="team"),
    path("team/members/<int:membership_id>", views.member_update, name="member-update"),
    path("team/invitations/<int:invitation_id>/revoke", views.invitation_revoke_view, name="invitation-revoke"),
    path("invitations/<str:token>", views.invitation, name="invitation"),
    path("accounts", views.accounts, name="accounts"),
    path("accounts/connect/<str:kind>", views.account_connect, name="account-connect"),
    path("accounts/<int:account_id>/edit", views.account_edit, name="account-edit"),
    path("accounts/<int:account_id>/sync", views.account_sync, name="account-sync"),
    path("accounts/<int:account_id>/sla", views.account_sla, name="account-sla"),
    path("machines", views.machines, name="machines"),
    path("machines/new", views.machine_new, name="machine-new"),
    path("machines/<int:machine_id>/prices", views.machine_prices, name="machine-prices"),
    path("dashboard", views.dashboard, name="dashboard"),
    path("earnings", views.earnings, name="earnings"),
    path("orders/<uuid:order_id>/receipt", views.order_receipt, name="order-receipt"),
    path("payouts", payouts.payouts, name="payouts"),
    path("payouts/onboard", payouts.payouts_onboard, name="payouts-onboard"),
    path("payouts/connect/return", payouts.payouts_connect_return, name="payouts-connect-return"),
    path("payouts/run", payouts.payouts_run, name="payouts-run"),
]
