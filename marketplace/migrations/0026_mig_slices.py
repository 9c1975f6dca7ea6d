"""MIG slices sold on independent machines: a hold may be one slice of a GPU (its profile, placement and size),
and every hold's memory slices are rows of ``GpuSlot``, unique per GPU, so no two holds share any part of a
GPU. Holds made before this keep their GPUs whole: their slots are written here."""

import django.db.models.deletion
from django.db import migrations, models


def whole_gpu_slots(apps, schema_editor):
    GpuHold = apps.get_model("marketplace", "GpuHold")
    GpuSlot = apps.get_model("marketplace", "GpuSlot")
    GpuSlot.objects.bulk_create(
        GpuSlot(hold_id=pk, machine_id=machine_id, gpu_index=index, slot=slot)
        for pk, machine_id, index in GpuHold.objects.values_list("pk", "machine_id", "gpu_index").iterator()
        for slot in range(8)
    )


class Migration(migrations.Migration):
    dependencies = [
        ("marketplace", "0025_bids"),
        ("providers", "0006_agent_commands"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpuhold",
            name="mig_profile",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
        migrations.AddField(
            model_name="gpuhold",
            name="slot",
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="gpuhold",
            name="memory_slices",
            field=models.PositiveSmallIntegerField(default=8),
        ),
        migrations.AddField(
            model_name="gpuhold",
            name="compute_slices",
            field=models.PositiveSmallIntegerField(default=7),
        ),
        migrations.RemoveConstraint(model_name="gpuhold", name="gpu_hold_unique_index"),
        migrations.AddConstraint(
            model_name="gpuhold",
            constraint=models.UniqueConstraint(
                condition=models.Q(("mig_profile", "")),
                fields=("machine", "gpu_index"),
                name="gpu_hold_whole_unique_index",
            ),
        ),
        migrations.AddConstraint(
            model_name="gpuhold",
            constraint=models.CheckConstraint(
                condition=models.Q(("compute_slices", 7), ("memory_slices", 8), ("mig_profile", ""), ("slot", 0))
                | (
                    ~models.Q(("mig_profile", ""))
                    & models.Q(("compute_slices__gte", 1), ("compute_slices__lte", models.F("memory_slices")))
                    & models.Q(("slot__lte", 8 - models.F("memory_slices")))
                    & (
                        models.Q(("compute_slices__lt", models.F("memory_slices")))
                        | models.Q(("slot__lte", 7 - models.F("memory_slices")))
                    )
                ),
                name="gpu_hold_shape",
            ),
        ),
        migrations.CreateModel(
            name="GpuSlot",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("gpu_index", models.PositiveSmallIntegerField()),
                ("slot", models.PositiveSmallIntegerField()),
                (
                    "hold",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="slots", to="marketplace.gpuhold"
                    ),
                ),
                (
                    "machine",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="providers.machine",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("machine", "gpu_index", "slot"), name="gpu_slot_unique"),
                    models.CheckConstraint(condition=models.Q(("slot__lte", 7)), name="gpu_slot_within_gpu"),
                ],
            },
        ),
        migrations.RunPython(whole_gpu_slots, migrations.RunPython.noop),
    ]
