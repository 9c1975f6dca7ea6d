"""Local emulators of the clouds, for tests and demos: the real SDKs talk to them over HTTP on 127.0.0.1.

One module per provider (``aws``), sharing ``faults`` (the injectable fault registry) and ``server``
(threaded HTTP, the ``/_sandbox/`` control API). Run them standalone with ``python -m providers.sandbox serve``.
"""

# Regions a demo account is pointed at, per sandbox kind: seeded regions with a broad mix of GPU types.
DEMO_REGIONS: dict[str, list[str]] = {
    "aws": ["us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1"],
    "azure": ["eastus", "southcentralus", "westus", "westus3"],
    "tencent": ["ap-guangzhou", "ap-shanghai", "ap-beijing"],
    "alibaba": ["cn-shanghai"],
    "gcp": ["us-central1", "europe-west4", "us-east4", "asia-south1", "asia-northeast1"],
}
