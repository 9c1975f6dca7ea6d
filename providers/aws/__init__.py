"""AWS EC2 provider: ``adapter.AwsAdapter`` (the contract, with ``order_resources``), the pure tables (``errors``,
``catalog``, ``mapping``, ``launching``) and ``client`` (the SDK)."""
