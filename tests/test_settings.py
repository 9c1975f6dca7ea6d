"""Bad settings stop start-up with a message that names the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _start(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"}}
    clean.update({"DJANGO_SETTINGS_MODULE": "broker.settings", "BROKER_VAR_DIR": str(tmp_path), **env})
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); print('started')"],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DATABASE_URL": "mysql://root@127.0.0.1/x"}, "DATABASE_URL="),
        ({"DATABASE_URL": "postgres://u@127.0.0.1:5432/"}, "DATABASE_URL is not valid: it names no database"),
        ({"CELERY_BROKER_URL": "kafka://127.0.0.1"}, "CELERY_BROKER_URL='kafka://127.0.0.1' is not valid"),
        ({"SECRET_KEY": "short"}, "SECRET_KEY is too short"),
        ({"DJANGO_DEBUG": "maybe"}, "DJANGO_DEBUG='maybe' is not valid"),
        ({"DJANGO_DEBUG": "0"}, "SECRET_KEY must be set when DJANGO_DEBUG is off"),
        ({"DJANGO_DEBUG": "0", "SECRET_KEY": "k" * 40}, "BROKER_PUBLIC_URL must be set when DJANGO_DEBUG is off"),
        (
            {"DJANGO_DEBUG": "0", "SECRET_KEY": "k" * 40, "BROKER_PUBLIC_URL": "http://broker.example"},
            "BROKER_PUBLIC_URL='http://broker.example' is not valid: expected an https:// URL",
        ),
        ({"BROKER_PUBLIC_URL": "broker.example"}, "BROKER_PUBLIC_URL='broker.example' is not valid"),
        ({"BROKER_BOOT_TIMEOUT_S": "soon"}, "BROKER_BOOT_TIMEOUT_S='soon' is not valid"),
        ({"BROKER_OFFER_MAX_AGE_S": "soon"}, "BROKER_OFFER_MAX_AGE_S='soon' is not valid: expected an integer"),
        ({"REDIS_URL": "127.0.0.1:6379"}, "REDIS_URL='127.0.0.1:6379' is not valid"),
        ({"BROKER_API_RATE_READ": "lots"}, "BROKER_API_RATE_READ='lots' is not valid: expected e.g. 600/min"),
        ({"BROKER_API_RATE_WRITE": "10/fortnight"}, "BROKER_API_RATE_WRITE='10/fortnight' is not valid"),
        ({"BROKER_PROVIDER_ENDPOINTS": "anywhere"}, "BROKER_PROVIDER_ENDPOINTS='anywhere' is not valid"),
        ({"EMAIL_PORT": "smtp"}, "EMAIL_PORT='smtp' is not valid"),
    ],
)
def test_a_bad_setting_names_the_variable(tmp_path, env, message):
    result = _start(tmp_path, **env)

    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_embedded_defaults_start_with_no_settings(tmp_path):
    result = _start(tmp_path)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "started"


def test_a_connection_pool_is_configured_for_postgresql_when_asked(tmp_path):
    # Issue 23: many processes share PostgreSQL through small per-process pools (psycopg_pool).
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="broker.settings", BROKER_VAR_DIR=str(tmp_path),
               DATABASE_URL="postgres://u@127.0.0.1:5432/x", BROKER_DB_POOL_MAX="8")  # fmt: skip
    started = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.conf import settings; "
         "d = settings.DATABASES['default']; print(d['OPTIONS']['pool'], d.get('CONN_MAX_AGE'))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert "'max_size': 8" in started.stdout and "'min_size': 2" in started.stdout
