"""Google Cloud provider: ``adapter.GcpAdapter`` (the contract), ``mapping`` (pure tables), ``client`` (the SDKs)."""
