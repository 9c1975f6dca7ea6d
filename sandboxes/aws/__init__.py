"""The AWS sandbox (stands in for ``providers.aws``): moto's EC2 plus the Price List, spot prices, key checks,
launch refusals and placement groups moto lacks. ``app`` serves it; see sandboxes/README.md."""
