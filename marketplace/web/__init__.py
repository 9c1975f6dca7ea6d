"""Server-rendered storefront views."""
