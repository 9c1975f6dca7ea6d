from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, not at the top: Django loads the models only after every app's module is imported.
        # reactions: the one table of what happens on each of the order's events (marketplace/reactions.py).
        # machines: the market's receivers of the provider side's signals (a machine's state change, ledgered).
        # tasks: every process registers them (a worker would anyway): services queue them by name
        # (marketplace.taskkit.enqueue), and a web process imports no task module otherwise.
        from marketplace import machines, tasks  # noqa: F401
        from marketplace.events import handlers_install
        from marketplace.reactions import HANDLERS

        handlers_install(HANDLERS)
