from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The market's receivers of the provider side's signals (the ledger entry of a machine's state change).
        from marketplace import machines  # noqa: F401

        # Every process registers the tasks (a worker would anyway): services queue them by name
        # (marketplace.taskkit.enqueue), and a web process imports no task module otherwise.
        from marketplace import tasks  # noqa: F401
