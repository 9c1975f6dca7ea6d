"""Local emulators of the outside world (the clouds, Stripe, independent hosts), for tests and demos: the real
SDKs talk to them over HTTP on 127.0.0.1. Production code never imports this package (``tests/test_layers.py``).

One subpackage per emulated service (``aws``, ``azure``, ``gcp``, ``alibaba``, ``tencent``, ``kubernetes``,
``stripe``, ``community``), sharing ``faults`` (the injectable fault registry), ``server`` (threaded HTTP, the
``/_sandbox/`` control API), ``boot`` (machines that run the lease agent) and ``demo`` (how an account reaches
each). Run them standalone with ``python -m sandboxes serve``; README.md beside this file says what each follows.
"""

# Regions a demo account is pointed at, per sandbox kind: seeded regions with a broad mix of GPU types.
DEMO_REGIONS: dict[str, list[str]] = {
    "aws": ["us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1"],
    "azure": ["eastus", "southcentralus", "westus", "westus3"],
    "tencent": ["ap-guangzhou", "ap-shanghai", "ap-beijing"],
    "alibaba": ["cn-shanghai"],
    "gcp": ["us-central1", "europe-west4", "us-east4", "asia-south1", "asia-northeast1"],
    "kubernetes": ["eu-central"],  # the sandbox cluster's one region (sandboxes/kubernetes/seed.py REGION)
}
