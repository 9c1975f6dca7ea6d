from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The market's receivers of the provider side's signals (the ledger entry of a machine's state change).
        from marketplace import machines  # noqa: F401
