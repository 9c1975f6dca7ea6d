"""Health endpoints for load balancers and orchestrators (issue 23, point 5).

``GET /healthz`` (liveness): the process answers; it touches nothing else, so a database outage does not get
every web node restarted. ``GET /readyz`` (readiness): the web node can serve, each dependency checked within a
short deadline: the database (a query), the task broker (a connection), and the shared cache when one is
configured (Redis: counts that every node must share). 200 when all are up, else 503; the body names each check
and says only "ok" or what kind of failure, never an address or a credential. Workers have their own probe:
``celery -A broker inspect ping -d celery@$HOSTNAME`` (docs/DEPLOY.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from broker.celery import app as celery_app

CHECK_TIMEOUT_S = 2.0


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "alive"})


def _database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _task_broker() -> None:
    with celery_app.connection_for_write(settings.CELERY_BROKER_URL) as conn:
        conn.ensure_connection(max_retries=1, timeout=CHECK_TIMEOUT_S)


def _cache() -> None:
    key = "broker:readyz"
    cache.set(key, "1", timeout=10)
    if cache.get(key) != "1":
        raise RuntimeError("the cache did not keep a value")


CHECKS: dict[str, Callable[[], None]] = {"database": _database, "task_broker": _task_broker, "cache": _cache}


@require_GET
@never_cache
def readyz(request: HttpRequest) -> JsonResponse:
    results: dict[str, dict[str, object]] = {}
    for name, check in CHECKS.items():
        started = time.monotonic()
        try:
            check()
        except Exception as exc:  # a probe reports any failure; it never raises
            results[name] = {"ok": False, "error": type(exc).__name__}
        else:
            results[name] = {"ok": True}
        results[name]["seconds"] = round(time.monotonic() - started, 3)
    ready = all(result["ok"] for result in results.values())
    return JsonResponse({"status": "ready" if ready else "not ready", "checks": results}, status=200 if ready else 503)
