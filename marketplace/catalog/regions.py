"""Which jurisdiction a provider's region sits in, for data-residency demands ("EU only", "mainland China only").

Codes: US, CA, LATAM, EU, UK, CH (Switzerland), CN (mainland China), APAC (the rest of Asia-Pacific, Hong
Kong included: it is not mainland China for residency), ME, AF. Region names follow each cloud's own
catalogue; an unknown region maps to "" and never satisfies a jurisdiction filter.
"""

from __future__ import annotations

JURISDICTIONS = ("US", "CA", "LATAM", "EU", "UK", "CH", "CN", "APAC", "ME", "AF")

# Exact names first: the places where a prefix rule would be wrong.
_EXACT = {
    "ap-east-1": "APAC",  # AWS Hong Kong
    "cn-hongkong": "APAC",  # Alibaba Cloud Hong Kong
    "ap-hongkong": "APAC",  # Tencent Cloud Hong Kong
    "eu-west-2": "UK",  # AWS London
    "europe-west2": "UK",  # GCP London
    "europe-west6": "CH",  # GCP Zurich
    "eu-central-2": "CH",  # AWS Zurich
    "uksouth": "UK",
    "ukwest": "UK",
    "switzerlandnorth": "CH",
    "switzerlandwest": "CH",
}
_TENCENT_MAINLAND = ("ap-beijing", "ap-shanghai", "ap-guangzhou", "ap-chengdu", "ap-chongqing", "ap-nanjing")
_PREFIXES = (
    ("us-", "US"),
    ("ca-", "CA"),
    ("sa-", "LATAM"),
    ("southamerica-", "LATAM"),
    ("northamerica-", "CA"),
    ("eu-", "EU"),
    ("europe-", "EU"),
    ("cn-", "CN"),
    ("ap-", "APAC"),
    ("asia-", "APAC"),
    ("australia-", "APAC"),
    ("me-", "ME"),
    ("af-", "AF"),
    ("na-", "US"),  # Tencent's North American regions
)
# Azure names regions without separators ("eastus", "westeurope").
_AZURE_WORDS = (
    ("china", "CN"),
    ("us", "US"),
    ("europe", "EU"),
    ("france", "EU"),
    ("germany", "EU"),
    ("sweden", "EU"),
    ("norway", "EU"),
    ("poland", "EU"),
    ("italy", "EU"),
    ("spain", "EU"),
    ("canada", "CA"),
    ("brazil", "LATAM"),
    ("japan", "APAC"),
    ("korea", "APAC"),
    ("india", "APAC"),
    ("australia", "APAC"),
    ("asia", "APAC"),
    ("uae", "ME"),
    ("qatar", "ME"),
    ("israel", "ME"),
    ("southafrica", "AF"),
)


def jurisdiction_of(kind: str, region: str) -> str:
    """The jurisdiction code of ``region`` on a provider of ``kind``; "" when unknown."""
    region = region.lower()
    if region in _EXACT:
        return _EXACT[region]
    if kind == "tencent" and region in _TENCENT_MAINLAND:
        return "CN"
    if kind == "azure":
        # "southcentralus" ends in us, "westeurope" contains europe: check country words before "us".
        for word, code in sorted(_AZURE_WORDS, key=lambda w: w[0] == "us"):
            if word in region:
                return code
        return ""
    for prefix, code in _PREFIXES:
        if region.startswith(prefix):
            return code
    return ""
