"""WSGI entry point."""

import os

from django.core.wsgi import get_wsgi_application
from django.urls import get_resolver

from broker.limits import recursion_limit_ensure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")
application = get_wsgi_application()
# Every view module (and through them web3) imported now, not at the first request, so that the check below
# sees what those imports did to the recursion limit before any request is parsed.
get_resolver().url_patterns  # noqa: B018
recursion_limit_ensure()
