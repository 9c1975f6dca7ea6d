"""The demo logins seeded by ``manage.py demo seed`` for the sandbox run (no Django imports: the run
command reads them before Django starts)."""

DEMO_PASSWORD = "broker-demo-2026"  # noqa: S105 - a published demo login for the sandbox only
DEMO_BUYER = "alice"
DEMO_PROVIDER_ADMIN = "petra"
DEMO_STAFF = "sam"  # marketplace staff: verifies providers and machines in /admin/
DEMO_CLUSTER_ADMIN = "kai"  # sells a Kubernetes GPU cluster (the Kubernetes sandbox)
