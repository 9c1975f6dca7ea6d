"""The Celery application; tasks live in each app's tasks.py."""

import os

from celery import Celery
from celery.signals import worker_init, worker_process_init

from broker.limits import recursion_limit_ensure

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "broker.settings")

app = Celery("broker")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
@worker_process_init.connect
def _recursion_limit_at_start(**_: object) -> None:
    """Each worker process, once its task modules are imported: an import must not have raised the recursion
    limit, or a task parsing deep JSON overflows the C stack and the child dies (see broker/limits.py)."""
    recursion_limit_ensure()
