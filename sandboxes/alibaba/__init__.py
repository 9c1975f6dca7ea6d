"""The Alibaba Cloud sandbox (stands in for ``providers.alibaba``): the ECS RPC API, version 2014-05-26, with
ACS3-HMAC-SHA256 signatures. ``app`` serves it; see sandboxes/README.md."""
