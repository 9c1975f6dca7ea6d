"""AWS EC2 provider: ``adapter.AwsAdapter`` (the contract), ``mapping`` (pure tables), ``client`` (the SDK)."""
