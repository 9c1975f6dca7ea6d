from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # machines: the market's receivers of the provider side's signals (a machine's state change, ledgered).
        # tasks: every process registers them (a worker would anyway): services queue them by name
        # (marketplace.taskkit.enqueue), and a web process imports no task module otherwise.
        from marketplace import machines, tasks  # noqa: F401
