"""Microsoft Azure: Compute Resource Manager (azure-mgmt-compute) plus the Retail Prices REST API."""
