"""Alibaba Cloud ECS provider: ``adapter.AlibabaAdapter`` (the contract), ``mapping`` (pure tables) and
``client`` (the only SDK importer)."""
