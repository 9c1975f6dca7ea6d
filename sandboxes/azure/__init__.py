"""The Azure sandbox (stands in for ``providers.azure``): Resource Manager compute and network, Entra ID's
token endpoint and the Retail Prices API over HTTPS. ``app`` serves it; see sandboxes/README.md."""
