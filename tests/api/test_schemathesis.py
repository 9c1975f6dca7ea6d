"""Property-based tests of the REST API from its own OpenAPI schema (schemathesis): whatever a client sends,
the broker answers without a server error, and with the status codes and shapes its schema documents."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from marketplace.api.tokens import api_token_create
from marketplace.models import TokenScope

_django = get_wsgi_application()


def _app(environ, start_response):
    """The broker as a WSGI server runs it: every request has the address it came from (the default for who
    may reach a launched machine), which the test transport leaves out."""
    environ.setdefault("REMOTE_ADDR", "203.0.113.7")
    return _django(environ, start_response)


schema = schemathesis.openapi.from_wsgi("/api/v1/schema", _app)
# Procurements solve an assignment with HiGHS for up to their time limit: fewer of them keep CI quick.
EXAMPLES = {"POST /api/v1/procurements": 15}
DEFAULT_EXAMPLES = 30  # beside the coverage phase's boundary cases: 5,000+ requests in all
SENT: dict[str, int] = {}  # requests per operation, counted as they are sent


# positive_data_acceptance holds that a request the schema allows is accepted. Where acceptance turns on state
# no schema can hold, a schema-valid request is rightly refused with a 400 naming the field, and the check is
# skipped for these operations (every other check still runs on them):
STATEFUL_ACCEPTANCE = {
    "POST /api/v1/orders": "a launch configuration names the organisation's own SSH keys and templates; "
    "exactly one of offer and quote",
    "POST /api/v1/quotes": "a launch configuration names the organisation's own SSH keys and templates",
    "POST /api/v1/procurements": "a launch configuration names the organisation's own SSH keys and templates",
    "POST /api/v1/clusters": "a launch configuration names the organisation's own SSH keys and templates",
    "POST /api/v1/launch-templates": "a launch configuration names the organisation's own SSH keys",
    "PUT /api/v1/launch-templates/{template_id}": "a launch configuration names the organisation's own SSH keys",
    "POST /api/v1/ssh-keys": "the key must decode to a real public key of a known type",
    "POST /api/v1/webhooks": "the URL must name a host that resolves to a public address (no SSRF)",
    "PATCH /api/v1/webhooks/{webhook_id}": "the URL must name a host that resolves to a public address",
    "POST /api/v1/billing/topups": "the organisation's email must be verified before its first top-up",
    "GET /api/v1/ledger/consistency": "old may not exceed new",
    "POST /api/v1/fleets": "a rule's fields depend on its kind (a metric rule names its metric, a schedule rule "
    "its windows); min_replicas at most max_replicas; a launch configuration names the organisation's own keys",
    "PATCH /api/v1/fleets/{fleet_id}": "the fields change a fleet that must exist and be active; min_replicas at "
    "most max_replicas, with the stored bounds",
}


def positive_check_skipped(case) -> bool:
    """Also a cursor the API did not make (it is opaque, and signed to its listing) and a search the query
    language cannot parse are refused by design, whatever their text."""
    query = case.query or {}
    return case.operation.label in STATEFUL_ACCEPTANCE or "cursor" in query or bool(query.get("q"))


@pytest.fixture
def bearer(acme, alice, aws_account):
    """A token with every scope, in an organisation with a synced sandbox cloud to buy from. The WSGI handler
    closes the database connection after each request, as in production; here that connection holds the
    test's transaction, so it stays open (as Django's own test client arranges)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield api_token_create(organization=acme, user=alice, name="fuzz", scopes=list(TokenScope.values)).raw
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.django_db
@schema.parametrize()
# Derandomized: the same 1,000+ requests every run, so a failure reproduces and CI does not flicker.
@settings(max_examples=DEFAULT_EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_request_makes_the_api_fail(case, bearer):
    if case.operation.label in EXAMPLES and case.operation.label.startswith("POST /api/v1/procurements"):
        body = case.body if isinstance(case.body, dict) else {}
        if isinstance(body.get("time_limit"), int | float) and body["time_limit"] > 1:
            body["time_limit"] = 1
    auth = {"Authorization": f"Bearer {bearer}"}
    response = case.call(headers=auth)
    SENT[case.operation.label] = SENT.get(case.operation.label, 0) + 1
    excluded = [positive_data_acceptance] if positive_check_skipped(case) else []
    case.validate_response(response, headers=auth, excluded_checks=excluded)


def test_the_fuzzing_sent_at_least_a_thousand_requests():
    """Runs after the operations above (pytest keeps file order): the issue asks for 1,000 requests or more."""
    if not SENT:
        pytest.skip("run with the fuzzing tests above")
    assert sum(SENT.values()) >= 1000, SENT
    assert len(SENT) == len(list(schema.get_all_operations()))


@pytest.mark.django_db
def test_the_schema_and_its_interactive_ui_are_served_from_this_site(client):
    spec = client.get("/api/v1/schema", HTTP_ACCEPT="application/json").json()
    assert spec["openapi"].startswith("3.") and "/api/v1/offers" in spec["paths"]
    assert "scopedToken" in spec["components"]["securitySchemes"]
    page = client.get("/api/v1/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html and "unpkg" not in html and "cdn" not in html
    assert "<script>" not in html  # the init script is a separate file, as the content security policy requires
