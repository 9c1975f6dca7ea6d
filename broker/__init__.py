"""The Django project: settings, urls, the Celery app. It imports the apps; no app imports it."""

from broker.celery import app as celery_app

__all__ = ("celery_app",)
