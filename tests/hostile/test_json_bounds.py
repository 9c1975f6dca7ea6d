"""JSON from outside, bounded in nesting and size wherever it is parsed (issue 17, item 1).

web3's ``py_ecc`` raised the process's recursion limit to 100,000 on import, so the C JSON decoder overflowed
the C stack on a body nested 100,000 deep: a SIGSEGV killed the web process. The first test posts that body to
a real web process and asks it again afterwards; the others hold every parser to a depth and a size."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import requests
from brokerclient import bounds as client_bounds
from brokerclient.api import BrokerClient
from brokerclient.errors import BrokerError
from django.contrib.sessions.backends.db import SessionStore
from django.core.exceptions import ValidationError
from django.test import RequestFactory
from rest_framework.test import APIClient

from broker.limits import RECURSION_LIMIT, recursion_limit_ensure
from ledger.audit import cli as audit_cli
from marketplace.api.parsers import MAX_DEPTH
from marketplace.api.tokens import api_token_create
from marketplace.launch.config import launch_secrets
from marketplace.models import LaunchConfiguration, Order
from marketplace.portal.clouds import validate_service_account_json
from marketplace.web.drafts import SESSION_KEY, draft_load
from providers.aws.catalog import on_demand_usd
from providers.azure.pipeline import _json as azure_json
from providers.endpoints import account_endpoints
from providers.errors import CredentialsRejected, MalformedProviderResponse
from providers.gcp.adapter import _service_account_info
from providers.secrets import encrypt_secret
from providers.types import Credentials
from tests.test_worker import ROOT, _database_url
from untrusted.jsonbody import bounded_json, json_depth

DEEP = 100_000


def _deep(depth: int = DEEP) -> str:
    return '{"offer": ' + "[" * depth + "]" * depth + "}"


# The WSGI application every deployment serves, in a child process; it prints its port once it listens.
SERVE = textwrap.dedent("""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from broker.wsgi import application

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    server = make_server("127.0.0.1", 0, application, handler_class=Quiet)
    print(server.server_port, flush=True)
    server.serve_forever()
""")


@pytest.fixture
def web_process(transactional_db):
    """``broker.wsgi.application`` served by its own process on the test database; yields (process, port)."""
    env = dict(os.environ, DATABASE_URL=_database_url(), DJANGO_SETTINGS_MODULE="broker.settings")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE], cwd=ROOT, env=env, stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        line = proc.stdout.readline()  # blocks until it listens, or until it exits (an empty line)
        assert line.strip().isdigit(), f"the web process did not start (exit status {proc.wait()})"
        yield proc, int(line)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=20)
        proc.stdout.close()


def _request(port: int, method: str, path: str, body: bytes | None, token: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    status, text = response.status, response.read()
    conn.close()
    return status, json.loads(text)


def test_a_deeply_nested_body_is_refused_and_the_web_process_lives_on(alice, acme, web_process):
    proc, port = web_process
    token = api_token_create(organization=acme, user=alice, name="t", scopes=["orders:place", "offers:read"]).raw

    try:
        status, body = _request(port, "POST", "/api/v1/orders", _deep().encode(), token)
    except (ConnectionError, http.client.HTTPException) as exc:
        proc.wait(timeout=20)
        pytest.fail(f"the web process died ({exc!r}, exit status {proc.returncode})")

    assert status == 400, body
    assert body["error"]["code"] == "parse_error"
    assert f"nests deeper than {MAX_DEPTH} levels" in body["error"]["message"]
    # The same process answers the next request: it did not die.
    status, body = _request(port, "GET", "/api/v1/offers?limit=1", None, token)
    assert status == 200, body
    assert proc.poll() is None
    assert not Order.objects.exists()


# --- The recursion limit --------------------------------------------------------------------------------------

LIMIT_AFTER_IMPORTS = textwrap.dedent("""
    import sys

    import django

    django.setup()
    import broker.urls
    import ledger.chain
    from ledger.anchoring import _embedded_chain

    _embedded_chain()  # py-evm, imported when the embedded chain first runs
    print(sys.getrecursionlimit())
""")


def test_importing_the_broker_and_web3_leaves_the_recursion_limit_alone():
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="broker.settings")
    out = subprocess.run(
        [sys.executable, "-c", LIMIT_AFTER_IMPORTS], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )

    assert int(out.stdout.split()[-1]) == RECURSION_LIMIT == 1000


def test_the_wsgi_entry_point_restores_a_raised_recursion_limit():
    script = "import sys; sys.setrecursionlimit(100_000); import broker.wsgi; print(sys.getrecursionlimit())"
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="broker.settings")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True)

    assert int(out.stdout.split()[-1]) == RECURSION_LIMIT


def test_a_worker_process_restores_a_raised_recursion_limit():
    from celery.signals import worker_process_init

    sys.setrecursionlimit(100_000)
    try:
        worker_process_init.send(sender="test")
        assert sys.getrecursionlimit() == RECURSION_LIMIT
    finally:
        recursion_limit_ensure()


# --- Every parser refuses depth and size ----------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_the_depth_counts_brackets_outside_strings_only():
    assert json_depth('{"a": "[[[[", "b": ["\\"", {"c": []}]}') == 4
    assert json_depth("1") == 0
    assert json_depth(_nested(DEEP)) == DEEP
    # An unclosed string runs to the end (the parser refuses it) instead of making the scan backtrack.
    assert json_depth('"' + '\\"' * 50_000) == 0


def test_bounded_json_refuses_depth_size_and_non_json_numbers():
    assert bounded_json(b"") == {}
    assert bounded_json(_nested(16)) == json.loads(_nested(16))
    with pytest.raises(ValueError, match="nests deeper than 16 levels: 17"):
        bounded_json(_nested(17))
    with pytest.raises(ValueError, match="at most 10 are read"):
        bounded_json(b'"' + b"x" * 10 + b'"', max_bytes=10)
    for constant in (b"[NaN]", b"[Infinity]", b"[-Infinity]"):
        with pytest.raises(ValueError, match="not a JSON number"):
            bounded_json(constant)


@pytest.fixture
def api(alice) -> APIClient:
    client = APIClient()
    client.force_authenticate(alice)
    return client


@pytest.mark.django_db
def test_the_api_refuses_a_deep_body_naming_the_limit(api):
    response = api.generic("POST", "/api/v1/orders", _deep(MAX_DEPTH + 1).encode(), content_type="application/json")

    assert response.status_code == 400
    assert response.json()["error"] == {
        "code": "parse_error",
        "message": f"JSON parse error - the body nests deeper than {MAX_DEPTH} levels: {MAX_DEPTH + 2}",
    }
    assert not Order.objects.exists()


@pytest.mark.django_db
def test_the_api_refuses_a_body_over_the_upload_size_naming_it(api, settings):
    body = json.dumps({"offer": 1, "padding": "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE}).encode()

    response = api.generic("POST", "/api/v1/orders", body, content_type="application/json")

    assert response.status_code == 413  # as the agent endpoints answer
    assert response.json()["error"] == {
        "code": "too_large",
        "message": f"the body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes, the most the API reads",
    }
    assert not Order.objects.exists()


@pytest.mark.django_db
def test_a_cursor_of_deep_or_long_json_is_refused(api):
    deep = base64.urlsafe_b64encode(_nested(DEEP).encode()).decode()
    long = base64.urlsafe_b64encode(json.dumps({"t": "x", "v": ["1" * 2000]}).encode()).decode()

    for cursor in (deep, long):
        response = api.get("/api/v1/orders", {"cursor": cursor})
        assert response.status_code == 400
        assert list(response.json()["error"]["fields"]) == ["cursor"]


@pytest.mark.django_db
def test_a_session_draft_nested_deep_is_not_read(acme):
    request = RequestFactory().get("/")
    request.session = SessionStore()
    request.session[SESSION_KEY] = {"n1": encrypt_secret({"draft": _nested(DEEP)})}

    assert draft_load(request, "n1", organization=acme.pk) is None


def test_a_launch_configurations_stored_env_is_read_within_bounds():
    config = LaunchConfiguration(secrets_encrypted=encrypt_secret({"env": json.dumps({"A": [[["x"]]]})}))

    with pytest.raises(ValueError, match="deeper than 2 levels"):
        launch_secrets(config)


def _key(extra: object) -> str:
    return json.dumps({"type": "service_account", "client_email": "a@b", "private_key": "k", "x": extra})


def test_a_pasted_gcp_key_is_parsed_within_bounds_everywhere():
    deep, big = _key(json.loads(_nested(10))), _key("x" * 70_000)

    for key, limit in ((deep, "deeper than 4 levels"), (big, "at most 65536 are read")):
        with pytest.raises(ValidationError, match=limit):
            validate_service_account_json(key)
        with pytest.raises(CredentialsRejected, match=limit):
            _service_account_info(Credentials(kind="gcp", values={"service_account_json": key}))
        assert account_endpoints(Credentials(kind="gcp", values={"service_account_json": key}), {}) == []
    with pytest.raises(ValidationError, match="nests deeper than 4 levels: 1000"):
        validate_service_account_json(_nested(1000))


class _Answer:
    """What the Azure client reads of an SDK response: its bytes."""

    def __init__(self, content: bytes):
        self.content = content


def test_cloud_answers_our_code_parses_are_bounded():
    with pytest.raises(ValueError, match="deeper than 32 levels"):
        azure_json(_Answer(_nested(DEEP).encode()))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="are read"):
        azure_json(_Answer(b" " * (8 * 1024 * 1024 + 1)))  # type: ignore[arg-type]
    with pytest.raises(MalformedProviderResponse, match="deeper than 16 levels"):
        on_demand_usd([_nested(DEEP)])
    with pytest.raises(MalformedProviderResponse, match="are read"):
        on_demand_usd(['"' + "x" * (1024 * 1024) + '"'])


def test_the_auditor_refuses_a_deep_bundle(tmp_path):
    bundle = tmp_path / "bundle.json"
    bundle.write_text('{"format": ' + _nested(DEEP) + "}")

    with pytest.raises(audit_cli._Unreadable, match="deeper than 64 levels"):
        audit_cli._load_json(str(bundle), "bundle")


def test_the_client_refuses_a_deep_answer_naming_the_limit():
    response = requests.Response()
    response.status_code, response._content = 200, _nested(DEEP).encode()

    with pytest.raises(BrokerError, match="nests deeper than the 64 levels") as refused:
        BrokerClient("http://127.0.0.1:9", token="brk_x")._answer(response, 1, None)
    assert refused.value.code == "bad_response"
    with pytest.raises(ValueError, match="over the 10 this client reads"):
        client_bounds.loads(b"[" + b"1," * 10 + b"1]", max_bytes=10)
