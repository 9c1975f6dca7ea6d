"""The Tencent Cloud sandbox (stands in for ``providers.tencent``): the CVM and VPC APIs 3.0 with TC3-HMAC-SHA256
signatures. ``app`` serves it; see sandboxes/README.md."""
