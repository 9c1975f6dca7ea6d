"""GPU indexes held on independent machines (issue 19): two orders can never get the same GPU."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("marketplace", "0022_instance_inactive_when_ended"),
        ("providers", "0004_machine_per_gpu_listing"),
    ]

    operations = [
        migrations.CreateModel(
            name="GpuHold",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("gpu_index", models.PositiveSmallIntegerField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "attempt",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="gpu_holds", to="marketplace.attempt"
                    ),
                ),
                (
                    "machine",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="gpu_holds",
                        to="providers.machine",
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("machine", "gpu_index"), name="gpu_hold_unique_index")],
            },
        ),
    ]
