"""Instances of orders that ended stay ``active`` no longer (issue 17): a normal termination used to leave the
flag set, so the reconciler took a terminated order's machine for a live one and the connection page kept it."""

from django.db import migrations

# Literal states, not the model's constants: a migration must keep meaning what it meant when written.
ENDED = ["terminated", "failed", "cancelled"]


def deactivate_ended(apps, schema_editor):
    Instance = apps.get_model("marketplace", "Instance")
    Instance.objects.filter(active=True, order__state__in=ENDED).update(active=False)


class Migration(migrations.Migration):
    dependencies = [("marketplace", "0021_launch_configurations")]

    operations = [migrations.RunPython(deactivate_ended, migrations.RunPython.noop)]
