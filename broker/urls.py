from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(template_name="registration/login.html"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include("marketplace.api.urls")),
    path("provider/", include("marketplace.portal.urls")),
    path("agent/v1/", include("providers.community.agent_api")),
    path("", include("marketplace.web.urls")),
]
