"""Shared fixtures: personas (alice buyer, bob her teammate, charlie a stranger, petra a provider admin)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from broker.celery import app as celery_app
from marketplace.models import Membership, Organization, OrganizationKind, Role


@pytest.fixture(autouse=True)
def _eager_celery():
    """Tasks run in-process unless a test starts a real worker (tests/test_worker.py)."""
    celery_app.conf.task_always_eager = True
    celery_app.conf.task_eager_propagates = True
    yield
    celery_app.conf.task_always_eager = False


def _user(name: str):
    return get_user_model().objects.create_user(username=name, email=f"{name}@example.com", password="pw-" + name)


@pytest.fixture
def acme(db) -> Organization:
    return Organization.objects.create(name="Acme Research", kind=OrganizationKind.BUYER)


@pytest.fixture
def alice(acme):
    user = _user("alice")
    Membership.objects.create(user=user, organization=acme, role=Role.OWNER)
    return user


@pytest.fixture
def bob(acme):
    user = _user("bob")
    Membership.objects.create(user=user, organization=acme, role=Role.MEMBER)
    return user


@pytest.fixture
def charlie(db):
    user = _user("charlie")
    other = Organization.objects.create(name="Charlie Labs", kind=OrganizationKind.BUYER)
    Membership.objects.create(user=user, organization=other, role=Role.OWNER)
    return user
