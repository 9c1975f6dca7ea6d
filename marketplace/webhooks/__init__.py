"""Webhooks: order and instance events POSTed, signed, to the URLs an organisation registers."""
