"""The GCP sandbox (stands in for ``providers.gcp``): Compute Engine v1 and the Cloud Billing Catalog over
REST/JSON, with service-account token checks. ``app`` serves it; see sandboxes/README.md."""
