import datetime
from decimal import Decimal

from django.db import migrations


def seed(apps, schema_editor):
    FxRate = apps.get_model("marketplace", "FxRate")
    FxRate.objects.get_or_create(
        currency="CNY",
        defaults={
            "usd_per_unit": Decimal("0.14"),
            # Not a market quote: operators set a dated rate with `manage.py fx set CNY <rate> --source ...`.
            "source": "placeholder rate for the sandbox (about 7.14 CNY per USD); replace with a dated quote",
            "as_of": datetime.date(2026, 12, 2),
        },
    )


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0003_instance_history")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
