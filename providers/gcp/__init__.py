"""Google Cloud provider: ``adapter.GcpAdapter`` (the contract), the pure tables (``errors``, ``catalog``,
``mapping``, ``launching``) and ``client`` (the SDKs)."""
