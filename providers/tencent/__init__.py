"""Tencent Cloud CVM provider: ``adapter.TencentAdapter`` (the contract), ``mapping`` (pure tables) and
``client`` (the only module importing the SDK)."""
