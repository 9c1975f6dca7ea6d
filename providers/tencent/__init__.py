"""Tencent Cloud CVM provider: ``adapter.TencentAdapter`` (the contract), the pure tables (``errors``, ``catalog``,
``mapping``, ``launching``) and ``client`` (the only module importing the SDK)."""
