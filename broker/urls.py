from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from broker.health import healthz, readyz
from broker.metrics import metrics_view
from broker.security import login_throttled, sign_in

urlpatterns = [
    # Ahead of the admin's own routes, so its sign-in form is throttled like the site's.
    path("admin/login/", login_throttled(admin.site.login)),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("login/", sign_in, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("marketplace.api.urls")),
    path("provider/", include("marketplace.portal.urls")),
    path("agent/v1/lease/", include("marketplace.launch.agent_api")),
    path("agent/v1/", include("providers.community.agent_api")),
    path("", include("marketplace.web.urls")),
]
