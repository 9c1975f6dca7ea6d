"""The Stripe sandbox (stands in for Stripe itself, which the marketplace's payments call): the parts of API v1
the broker uses, with signed webhooks. ``app`` serves it; see sandboxes/README.md."""
