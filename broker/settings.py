"""Settings for the broker, read from the environment.

Every variable has an embedded default that runs on a fresh machine with no servers (SQLite, a filesystem
Celery broker, sandbox clouds). A bad value stops start-up with a message that names the variable.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

from broker.env import (
    env_bool,
    env_broker_url,
    env_database,
    env_float,
    env_int,
    env_list,
    env_rate,
    env_str,
)
from broker.queues import DEFAULT_QUEUE, QUEUES, ROUTES
from marketplace.beat import beat_schedule

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("BROKER_VAR_DIR", str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DJANGO_DEBUG", True)


def _secret_key() -> str:
    key = env_str("SECRET_KEY")
    if key:
        if len(key) < 32:
            raise ImproperlyConfigured("SECRET_KEY is too short: use at least 32 random characters")
        return key
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DJANGO_DEBUG is off")
    # A development key that survives restarts, so sessions and encrypted secrets stay readable.
    path = VAR_DIR / "dev-secret-key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "providers",
    "ledger",
    "marketplace",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "broker.security.ContentSecurityPolicyMiddleware",
]

# Secure headers everywhere; HTTPS-only cookies, HSTS and the redirect when deployed (DJANGO_DEBUG=0).
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("BROKER_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("BROKER_HSTS_SECONDS", 31_536_000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    if env_bool("BROKER_BEHIND_TLS_PROXY", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Bearer token for Prometheus scraping /metrics from another host (loopback needs none).
METRICS_TOKEN = env_str("BROKER_METRICS_TOKEN")
# Proxies in front of the broker that append to X-Forwarded-For (a TLS proxy: 1). The client's address is the
# one the outermost trusted proxy saw; with 0, REMOTE_ADDR. Sign-in and API throttles key on it.
TRUSTED_PROXY_HOPS = env_int("BROKER_TRUSTED_PROXY_HOPS", 0, minimum=0)
# Sign-in throttling (broker/security.py): failed tries within the window per username and address, per
# address (many names from one place) and per username (many places, looser so one attacker cannot lock a
# user out). Counted in the cache: every web process shares the counts only through REDIS_URL.
LOGIN_FAILURE_LIMIT = env_int("BROKER_LOGIN_FAILURE_LIMIT", 5, minimum=1)
LOGIN_FAILURE_LIMIT_ADDRESS = env_int("BROKER_LOGIN_FAILURE_LIMIT_ADDRESS", 20, minimum=1)
LOGIN_FAILURE_LIMIT_ACCOUNT = env_int("BROKER_LOGIN_FAILURE_LIMIT_ACCOUNT", 50, minimum=1)
LOGIN_FAILURE_WINDOW_S = env_int("BROKER_LOGIN_FAILURE_WINDOW_S", 900, minimum=1)

ROOT_URLCONF = "broker.urls"
WSGI_APPLICATION = "broker.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "marketplace.portal.context_processors.organization_kinds",
            ],
        },
    },
]

_SQLITE_PATH = VAR_DIR / "broker.sqlite3"
_SQLITE_DEFAULT = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": str(_SQLITE_PATH),
}
DATABASES = {"default": env_database("DATABASE_URL", _SQLITE_DEFAULT)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web, worker and beat write at once: WAL lets readers run beside the writer, IMMEDIATE takes the write
    # lock at BEGIN so two writers queue on the busy timeout instead of failing on lock upgrade.
    DATABASES["default"]["OPTIONS"] = {
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
    }
    # A file, not :memory:, so a real worker process started by a test sees the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
DATABASES["default"]["ATOMIC_REQUESTS"] = False
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Many web and worker processes: each keeps a small pool of connections (psycopg's) instead of opening one
    # per request or task; without a pool, connections may be kept open between requests instead.
    _POOL_MAX = env_int("BROKER_DB_POOL_MAX", 0, minimum=0)
    if _POOL_MAX:
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps the connections
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(2, _POOL_MAX),
            "max_size": _POOL_MAX,
            "timeout": env_float("BROKER_DB_POOL_TIMEOUT_S", 10.0, minimum=1.0),
        }
    else:
        DATABASES["default"]["CONN_MAX_AGE"] = env_int("BROKER_DB_CONN_MAX_AGE", 60, minimum=0)
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_REDIS_URL = env_str("REDIS_URL")
if _REDIS_URL:
    if not _REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"REDIS_URL={_REDIS_URL!r} is not valid: expected redis://host:port/db")
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _REDIS_URL}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# Provider request rate limits shared by every worker (providers/ratelimit.py); empty: per-process buckets.
PROVIDER_RATE_LIMIT_REDIS_URL = env_str("PROVIDER_RATE_LIMIT_REDIS_URL", _REDIS_URL)

AUTH_PASSWORD_VALIDATORS = [
    # Every form that sets a password (sign-up, invitation, admin, createsuperuser) passes the user, so a
    # password like the username or email is refused.
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "storefront:offers"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "broker" / "static"]

# The most of a request body read into memory (Django's default, 2.5 MiB, stated so the API's JSON parser, which
# reads the stream itself, applies the same bound).
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "marketplace.api.tokens.ScopedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "marketplace.api.tokens.HasScope",
    ],
    "DEFAULT_THROTTLE_CLASSES": ["marketplace.api.throttling.TokenRateThrottle"],
    "EXCEPTION_HANDLER": "marketplace.api.errors.exception_handler",
    # JSON bounded in size (DATA_UPLOAD_MAX_MEMORY_SIZE) and nesting before the decoder runs (issue 17).
    "DEFAULT_PARSER_CLASSES": [
        "marketplace.api.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "COERCE_DECIMAL_TO_STRING": True,
    "DEFAULT_SCHEMA_CLASS": "marketplace.api.schema.BrokerAutoSchema",
}
# OpenAPI 3 at /api/v1/schema, an interactive UI at /api/v1/docs served from this site (no CDN).
SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Broker procurement API",
    "DESCRIPTION": "Search GPU offers across clouds and independent providers, quote workloads, order, watch, "
    "terminate, and fetch ledger receipts. Authenticate with `Authorization: Bearer brk_...` (a scoped token).",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Request bodies are JSON: one content type, so a generated client sends JSON (forms still parse).
    "PARSER_WHITELIST": ["marketplace.api.parsers.BoundedJSONParser"],
    "ENUM_NAME_OVERRIDES": {
        # GPU model keys are one choice set wherever a request names a GPU (gpu_models, work_reference_gpu).
        "GpuModelEnum": "providers.gpu_names.SORTED",
        # Several choice sets are answered in fields named "state": each named, not numbered.
        "OrderStateEnum": "marketplace.models.OrderState",
        "TopUpStateEnum": "marketplace.models.TopUpState",
        "LeaseStateEnum": "marketplace.models.LeaseState",
    },
    # The launch configuration's components, written as JSON Schema from marketplace/launch/config.py's limits.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "marketplace.api.schema.add_components"],
}

# --- Email ----------------------------------------------------------------------------------------------------
# Team invitations are emailed. Development writes each message to a file under var/mail (no server needed);
# production sends through SMTP at EMAIL_HOST.
EMAIL_BACKEND = env_str(
    "EMAIL_BACKEND",
    "django.core.mail.backends.filebased.EmailBackend" if DEBUG else "django.core.mail.backends.smtp.EmailBackend",
)
EMAIL_FILE_PATH = VAR_DIR / "mail"
EMAIL_HOST = env_str("EMAIL_HOST", "127.0.0.1")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "GPU Broker <no-reply@localhost>")

# --- Celery -------------------------------------------------------------------------------------------------
CELERY_DATA_DIR = VAR_DIR / "celery"
CELERY_BROKER_URL = env_broker_url("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's, with each message written whole before a consumer can see it (broker/fstransport.py).
    CELERY_BROKER_TRANSPORT = "broker.fstransport:Transport"
    for sub in ("queue", "processed", "control"):
        (CELERY_DATA_DIR / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_DATA_DIR / "queue"),
        "data_folder_out": str(CELERY_DATA_DIR / "queue"),
        "processed_folder": str(CELERY_DATA_DIR / "processed"),
        "control_folder": str(CELERY_DATA_DIR / "control"),
        "store_processed": False,
    }
elif CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    # Redis redelivers an unacknowledged task only after this timeout; keep it above the longest task.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600, minimum=60)}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Every task has a time limit. At the soft one the task gets SoftTimeLimitExceeded (a sweep stops there, what it
# did stays done); at the hard one the worker kills the child. Tasks that need more or less set their own in
# their decorator. Only the prefork pool (the default) enforces limits; solo and threads ignore them. The limits
# travel in each task message from the process that queued it: web, beat and workers need the same values. At
# most 3000 s: a task must end before Redis would hand it to another worker (CELERY_VISIBILITY_TIMEOUT).
CELERY_TASK_SOFT_TIME_LIMIT = env_float("BROKER_TASK_SOFT_TIME_LIMIT_S", 300.0, minimum=1.0, maximum=3000.0)
CELERY_TASK_TIME_LIMIT = env_float("BROKER_TASK_TIME_LIMIT_S", CELERY_TASK_SOFT_TIME_LIMIT + 60, minimum=2.0)
if CELERY_TASK_TIME_LIMIT <= CELERY_TASK_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured(
        f"BROKER_TASK_TIME_LIMIT_S={CELERY_TASK_TIME_LIMIT:g} is not valid: it must be above "
        f"BROKER_TASK_SOFT_TIME_LIMIT_S={CELERY_TASK_SOFT_TIME_LIMIT:g}, so a task can stop cleanly before it is killed"
    )
# Webhook deliveries on a queue of their own, consumed by a worker of their own (broker/queues.py).
CELERY_TASK_DEFAULT_QUEUE = DEFAULT_QUEUE
# Each queue on a direct exchange of its own name, as Celery makes a missing queue: queues declared before
# this list existed stay the same queues.
CELERY_TASK_QUEUES = [Queue(name, Exchange(name, type="direct"), routing_key=name) for name in QUEUES]
CELERY_TASK_ROUTES = {name: {"queue": queue} for name, queue in ROUTES.items()}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
OFFER_SYNC_INTERVAL_S = env_float("BROKER_OFFER_SYNC_INTERVAL_S", 300.0, minimum=10.0)
# At most this many account syncs queued or running at once; each that ends queues the next due account.
OFFER_SYNC_IN_FLIGHT = env_int("BROKER_OFFER_SYNC_IN_FLIGHT", 64, minimum=1)
# The marketplace's commission on what buyers pay, deducted in providers' payout statements.
COMMISSION_SHARE = env_float("BROKER_COMMISSION_SHARE", 0.12, minimum=0.0)
# Payments (issue 22). The defaults reach the Stripe sandbox that the run command starts on 127.0.0.1
# (sandboxes/stripe/app.py); live payments set STRIPE_API_BASE=https://api.stripe.com and real keys.
STRIPE_API_BASE = env_str("STRIPE_API_BASE", "http://127.0.0.1:8706")
STRIPE_API_KEY = env_str("STRIPE_API_KEY", "sk_test_sandbox")
STRIPE_WEBHOOK_SECRET = env_str("STRIPE_WEBHOOK_SECRET", "whsec_sandbox")
STRIPE_TIMEOUT_SECONDS = env_float("STRIPE_TIMEOUT_SECONDS", 10.0, minimum=1.0, maximum=60.0)
# The broker as the seller on its invoices. BROKER_COUNTRY decides the EU reverse charge: a business buyer with a
# valid VAT id in another member state is invoiced without VAT ("" = established outside the EU).
BROKER_LEGAL_NAME = env_str("BROKER_LEGAL_NAME", "GPU Broker")
BROKER_LEGAL_ADDRESS = env_str("BROKER_LEGAL_ADDRESS", "")
BROKER_TAX_ID = env_str("BROKER_TAX_ID", "")
BROKER_COUNTRY = env_str("BROKER_COUNTRY", "")
# A provider's payable is paid out once it reaches this many minor units (cents): smaller payouts cost more in
# fees than they are worth.
# A card top-up waiting for 3-D Secure this long is cancelled at Stripe as abandoned (nothing is charged), so it
# never sits "waiting" on the Billing page; Stripe itself keeps such a PaymentIntent open indefinitely.
TOPUP_ACTION_TIMEOUT_S = env_float("BROKER_TOPUP_ACTION_TIMEOUT_S", 3600.0, minimum=300.0)
PAYOUT_MINIMUM_MINOR = env_int("BROKER_PAYOUT_MINIMUM_MINOR", 1000, minimum=1)
# An independent provider's machine whose agent is silent this long is withdrawn from sale.
AGENT_SILENCE_S = env_float("BROKER_AGENT_SILENCE_S", 120.0, minimum=10.0)
# An interruptible lease outbid (by a higher bid or an on-demand order) keeps its GPUs this long after notice.
PREEMPTION_NOTICE_S = env_float("BROKER_PREEMPTION_NOTICE_S", 30.0, minimum=0.0)
# Heartbeats kept for reliability (a day) and the utilization chart; older ones are deleted.
HEARTBEAT_RETENTION_S = env_float("BROKER_HEARTBEAT_RETENTION_S", 2 * 86400.0, minimum=86400.0)
# A machine not (or no longer) verified needs no reliability history: its few heartbeats go after this long.
UNVERIFIED_HEARTBEAT_RETENTION_S = env_float("BROKER_UNVERIFIED_HEARTBEAT_RETENTION_S", 3600.0, minimum=60.0)
# Heartbeats one machine may send per minute (its agent sends one every 15 s); more are refused with a 429.
AGENT_HEARTBEATS_PER_MINUTE = env_int("BROKER_AGENT_HEARTBEATS_PER_MINUTE", 12, minimum=1)
# How often the ledger is checkpointed (when it grew) and anchored.
LEDGER_CHECKPOINT_INTERVAL_S = env_float("LEDGER_CHECKPOINT_INTERVAL_S", 60.0, minimum=5.0)
# SLAs (issue 38, marketplace/sla/). An independent host's or a cluster's seller commits to at least this
# availability in percent; clouds state their published figure.
SLA_FLOOR_PCT = env_float("BROKER_SLA_FLOOR_PCT", 95.0, minimum=50.0, maximum=100.0)
# The broker's own SSH check of each running order: how often, the total time one probe may take (connect
# and banner), and how many failures in a row make an outage (it starts at the first of them).
SLA_SSH_PROBE_INTERVAL_S = env_float("BROKER_SLA_SSH_PROBE_INTERVAL_S", 60.0, minimum=10.0)
SLA_SSH_TIMEOUT_S = env_float("BROKER_SLA_SSH_TIMEOUT_S", 5.0, minimum=0.5, maximum=60.0)
SLA_SSH_FAILURES = env_int("BROKER_SLA_SSH_FAILURES", 3, minimum=1)
RECONCILE_INTERVAL_S = env_float("BROKER_RECONCILE_INTERVAL_S", 3600.0, minimum=60.0)
_PERIODIC = {
    "offers-sync-all": {"task": "marketplace.offers_sync_all", "schedule": OFFER_SYNC_INTERVAL_S},
    "orders-sweep": {"task": "marketplace.orders_sweep", "schedule": 60.0},
    "orders-reconcile": {"task": "marketplace.orders_reconcile", "schedule": 300.0},
    "clusters-gpus-read": {"task": "marketplace.clusters_gpus_read", "schedule": 60.0},
    "orders-silence": {"task": "marketplace.orders_silence_sweep", "schedule": 15.0},
    "sla-ssh-probe": {"task": "marketplace.sla_ssh_probe_all", "schedule": SLA_SSH_PROBE_INTERVAL_S},
    # Last month's SLAs judged and credited on the 1st at 01:00 UTC, after the month's last probes.
    "sla-month-close": {
        "task": "marketplace.sla_month_close",
        "schedule": crontab(minute="0", hour="1", day_of_month="1"),
    },
    "ledger-checkpoint": {"task": "ledger.checkpoint", "schedule": LEDGER_CHECKPOINT_INTERVAL_S},
    "ledger-sequence": {"task": "ledger.sequence", "schedule": 5.0},
    "machines-withdraw-silent": {"task": "marketplace.machines_withdraw_silent", "schedule": 30.0},
    "idempotency-expire": {"task": "marketplace.idempotency_expire", "schedule": 3600.0},
    "webhooks-sweep": {"task": "marketplace.webhooks_sweep", "schedule": 15.0},
    "fleets-evaluate": {"task": "marketplace.fleets_evaluate", "schedule": 30.0},
    # Last month's invoices, on the 1st at 02:00 UTC (entries of orders that ended just before midnight are in).
    "invoices-issue-due": {
        "task": "marketplace.invoices_issue_due",
        "schedule": crontab(minute="0", hour="2", day_of_month="1"),
    },
    "payouts-due": {"task": "marketplace.payouts_due", "schedule": 86400.0},
    "billing-sweep": {"task": "marketplace.billing_sweep", "schedule": 60.0},
    # Stripe against the book, yesterday and today (marketplace/billing/reconciliation.py).
    "reconcile-stripe": {"task": "marketplace.reconcile_stripe", "schedule": RECONCILE_INTERVAL_S},
}
# Each interval run is told its interval, so that two beats make one run per interval (marketplace/jobs.py).
CELERY_BEAT_SCHEDULE = beat_schedule(_PERIODIC)
# Task modules outside an app's tasks.py, which autodiscovery does not find.
CELERY_IMPORTS = ["marketplace.webhooks.tasks"]

# --- The broker ---------------------------------------------------------------------------------------------
# Offers not refreshed within this many seconds are not sold (their price may have moved).
OFFER_MAX_AGE_S = env_int("BROKER_OFFER_MAX_AGE_S", 3600, minimum=60)
# Seconds between polls of a launching instance, and how many polls before the order is declared stuck.
PROVISION_POLL_INTERVAL_S = env_float("BROKER_PROVISION_POLL_INTERVAL_S", 2.0, minimum=0.0)
PROVISION_POLL_LIMIT = env_int("BROKER_PROVISION_POLL_LIMIT", 150, minimum=1)
PROVISION_TRANSIENT_RETRIES = env_int("BROKER_PROVISION_TRANSIENT_RETRIES", 3, minimum=0)
# Where the machines orders launch reach the broker: their boot script fetches the lease agent from here and
# the agent phones home to it with the one-time boot token, then fetches the buyer's secrets over it. It must
# be https when deployed; in development the run command's own address.
PUBLIC_URL = env_str("BROKER_PUBLIC_URL", "" if not DEBUG else f"http://127.0.0.1:{env_str('BROKER_PORT', '8000')}")
if not PUBLIC_URL:
    raise ImproperlyConfigured(
        "BROKER_PUBLIC_URL must be set when DJANGO_DEBUG is off: the https URL rented machines reach the broker at"
    )
if not PUBLIC_URL.startswith("https://" if not DEBUG else ("http://", "https://")):
    raise ImproperlyConfigured(
        f"BROKER_PUBLIC_URL={PUBLIC_URL!r} is not valid: "
        + ("expected an https:// URL when DJANGO_DEBUG is off" if not DEBUG else "expected an http(s):// URL")
    )
PUBLIC_URL = PUBLIC_URL.rstrip("/")
# From launch to the agent's ready report: a machine silent this long fails its attempt, is terminated and
# the order fails over. Generous by default: a Deep Learning image boots in about two minutes, a driver
# installed at boot and a large container pull take longer.
BOOT_TIMEOUT_S = env_int("BROKER_BOOT_TIMEOUT_S", 1200, minimum=10)
# How often lease agents report telemetry.
LEASE_HEARTBEAT_S = env_float("BROKER_LEASE_HEARTBEAT_S", 15.0, minimum=1.0)
# A running order whose lease agent has not reported for this long (three missed heartbeats) is degraded: an
# instance.unhealthy webhook, a line on its page, its silent minutes recorded; its launch configuration's
# on_silence keeps it or replaces the machine (marketplace/orders/silence.py).
LEASE_SILENCE_S = env_float("BROKER_LEASE_SILENCE_S", max(10.0, 3 * LEASE_HEARTBEAT_S), minimum=10.0)
# Fleets (marketplace/fleets/): a replica whose agent has been silent this long is ended and replaced; a
# Prometheus endpoint on a replica is read within this total deadline; this many ranked offers are tried for
# each new replica (a provider may refuse the launch configuration) before the placement is given up.
FLEET_SILENT_GRACE_S = env_float("BROKER_FLEET_SILENT_GRACE_S", 300.0, minimum=10.0)
FLEET_SCRAPE_DEADLINE_S = env_float("BROKER_FLEET_SCRAPE_DEADLINE_S", 3.0, minimum=0.1)
FLEET_QUOTES_TRIED = env_int("BROKER_FLEET_QUOTES_TRIED", 5, minimum=1)
# A replica's Prometheus endpoint is read only at a public address (its agent reports it, and the renter controls
# the agent): on by default when deployed; a development machine's sandboxes sit on loopback and private nets.
FLEET_SCRAPE_PUBLIC_ONLY = env_bool("BROKER_FLEET_SCRAPE_PUBLIC_ONLY", not DEBUG)
# A fleet places no replica while this many of its replicas (at least 2, or its desired count) failed within
# this window: replicas failing as fast as they are placed must not churn orders in a loop.
FLEET_FAILURE_WINDOW_S = env_float("BROKER_FLEET_FAILURE_WINDOW_S", 300.0, minimum=10.0)
# How long a quote's price stays locked, and the time budget of a procurement batch's joint assignment.
# Requests per API token (or signed-in user, or anonymous address), reads and writes counted apart; quotes and
# procurements (seconds of ranking and solving each) also against the tighter "expensive" rate.
API_RATES = {
    "read": env_rate("BROKER_API_RATE_READ", "1200/min"),
    "write": env_rate("BROKER_API_RATE_WRITE", "120/min"),
    "expensive": env_rate("BROKER_API_RATE_EXPENSIVE", "20/min"),
}
# How long the API remembers the answer to a creating POST under its Idempotency-Key.
IDEMPOTENCY_KEEP_HOURS = env_int("BROKER_IDEMPOTENCY_KEEP_HOURS", 24, minimum=1)
QUOTE_TTL_S = env_int("BROKER_QUOTE_TTL_S", 900, minimum=30)
PROCUREMENT_TIME_LIMIT_S = env_float("BROKER_PROCUREMENT_TIME_LIMIT_S", 5.0, minimum=0.5)
# Expected spot preemptions per hour when a provider publishes no rate: an assumption (about one in two
# days), not a measurement; the ranking prices the restart it implies into every spot quote.
SPOT_INTERRUPTIONS_PER_HOUR = env_float("BROKER_SPOT_INTERRUPTIONS_PER_HOUR", 0.02, minimum=0.0)
# How long a failure blocks its scope for every order: a sold-out zone's instance type, a region of an
# account out of quota, an account whose credentials were refused. The tenth order does not re-hit them.
BLOCK_CAPACITY_S = env_int("BROKER_BLOCK_CAPACITY_S", 600, minimum=0)
BLOCK_QUOTA_S = env_int("BROKER_BLOCK_QUOTA_S", 1800, minimum=0)
BLOCK_CREDENTIALS_S = env_int("BROKER_BLOCK_CREDENTIALS_S", 3600, minimum=0)
# Placing an order warns once it takes an organisation past this share of its hourly or monthly budget.
BUDGET_WARN_SHARE = env_float("BROKER_BUDGET_WARN_SHARE", 0.8, minimum=0.0)
# Keys for encrypting provider credentials at rest: comma-separated Fernet keys, newest first.
SECRETS_KEYS = env_list("BROKER_SECRETS_KEYS", [])
_keys_file = env_str("BROKER_SECRETS_KEYS_FILE")
if _keys_file:
    try:
        SECRETS_KEYS = [k.strip() for k in Path(_keys_file).read_text().split(",") if k.strip()]
    except OSError as exc:
        raise ImproperlyConfigured(f"BROKER_SECRETS_KEYS_FILE={_keys_file!r} cannot be read: {exc}") from None

# Where webhooks may be sent. "loopback": only 127.0.0.1, ::1 and localhost, the embedded default, so a
# development machine or a test run never sends anything off the host. "public": only public addresses;
# loopback, private and link-local ones are refused (checked again at every send, against DNS rebinding),
# so a buyer cannot aim the broker at its own network or the cloud's metadata service.
WEBHOOK_DESTINATIONS = env_str("BROKER_WEBHOOK_DESTINATIONS", "loopback" if DEBUG else "public")
if WEBHOOK_DESTINATIONS not in {"loopback", "public"}:
    raise ImproperlyConfigured(
        f"BROKER_WEBHOOK_DESTINATIONS={WEBHOOK_DESTINATIONS!r} is not valid: expected loopback or public"
    )
# The most one webhook send may take in all (connect, send, status, headers and the answer's excerpt), so a
# receiver that trickles its answer holds a webhook worker no longer than this (marketplace/webhooks/sending.py).
# At most 240 s: a delivery being sent is due again after 5 minutes (services.LEASE).
WEBHOOK_SEND_DEADLINE_S = env_float("BROKER_WEBHOOK_DEADLINE_S", 15.0, minimum=0.1, maximum=240.0)

# Where a seller's cloud account may point the broker (providers/endpoints.py): public addresses, and in
# development loopback too, where the sandboxes listen.
PROVIDER_ENDPOINTS = env_str("BROKER_PROVIDER_ENDPOINTS", "public+loopback" if DEBUG else "public")
if PROVIDER_ENDPOINTS not in {"public", "public+loopback"}:
    raise ImproperlyConfigured(
        f"BROKER_PROVIDER_ENDPOINTS={PROVIDER_ENDPOINTS!r} is not valid: expected public or public+loopback"
    )

# The ledger's signed checkpoints and their anchors (ledger/checkpoints.py, ledger/anchoring.py).
LEDGER_ORIGIN = env_str("LEDGER_ORIGIN", "gpu-broker/ledger")
# Base64 of a 32-byte Ed25519 seed, or a file holding it; with neither, a key is made once in VAR_DIR.
LEDGER_SIGNING_KEY = env_str("LEDGER_SIGNING_KEY")
LEDGER_SIGNING_KEY_FILE = env_str("LEDGER_SIGNING_KEY_FILE", str(VAR_DIR / "ledger-signing.key"))
# Verifier keys of earlier signing keys (comma-separated), so checkpoints signed before a rotation still verify.
LEDGER_PREVIOUS_VERIFIER_KEYS = env_list("LEDGER_PREVIOUS_VERIFIER_KEYS", [])
# During a rotation: the retiring key's seed (base64, or a file holding it), to cosign the new key's first
# checkpoint so auditors can follow the rotation (README, "Rotating the checkpoint key").
LEDGER_PREVIOUS_SIGNING_KEY = env_str("LEDGER_PREVIOUS_SIGNING_KEY")
LEDGER_PREVIOUS_SIGNING_KEY_FILE = env_str("LEDGER_PREVIOUS_SIGNING_KEY_FILE")
# Any Ethereum JSON-RPC endpoint, with the sender's key in LEDGER_CHAIN_PRIVATE_KEY (hex) or
# LEDGER_CHAIN_PRIVATE_KEY_FILE. The run command sets both to its own node (ledger.chainnode, blocks kept in
# var/chain). Empty: an in-process test chain (eth-tester) that ends with the process: for tests only, since
# nobody outside the process can check an anchor on it.
LEDGER_CHAIN_RPC_URL = env_str("LEDGER_CHAIN_RPC_URL")
LEDGER_CHAIN_PRIVATE_KEY = env_str("LEDGER_CHAIN_PRIVATE_KEY")
LEDGER_CHAIN_PRIVATE_KEY_FILE = env_str("LEDGER_CHAIN_PRIVATE_KEY_FILE")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("BROKER_LOG_LEVEL", "INFO")},
    "loggers": {
        "botocore": {"level": "WARNING"},
        "urllib3": {"level": "WARNING"},
        "werkzeug": {"level": "WARNING"},
        # runserver's line per request; the run command sets WARNING, so its sign-in banner stays in view.
        "django.server": {"level": env_str("BROKER_REQUEST_LOG_LEVEL", "INFO")},
    },
}
