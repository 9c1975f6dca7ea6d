"""The market: catalogue, matching, orders and provisioning, the API and the storefront."""
