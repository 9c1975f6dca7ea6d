"""Machines may be sold per GPU (issue 19): the fewest GPUs a lease takes, and the MIG profiles offered. Every
machine listed before sells whole, as it did: its minimum is its GPU count."""

from django.db import migrations, models


def sold_whole(apps, schema_editor):
    Machine = apps.get_model("providers", "Machine")
    Machine.objects.update(min_gpus_per_lease=models.F("gpu_count"))


class Migration(migrations.Migration):
    dependencies = [("providers", "0003_machine_heartbeat_window")]

    operations = [
        migrations.AddField(
            model_name="machine",
            name="min_gpus_per_lease",
            field=models.PositiveSmallIntegerField(default=1),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="machine",
            name="mig_profiles",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(sold_whole, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="machine",
            constraint=models.CheckConstraint(
                condition=models.Q(min_gpus_per_lease__gte=1, min_gpus_per_lease__lte=models.F("gpu_count")),
                name="machine_min_gpus_per_lease_within_count",
            ),
        ),
    ]
