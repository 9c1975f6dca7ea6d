"""Alibaba Cloud ECS provider: ``adapter.AlibabaAdapter`` (the contract, with ``order_resources``), the pure tables
(``errors``, ``catalog``, ``mapping``, ``launching``) and ``client`` (the only SDK importer)."""
