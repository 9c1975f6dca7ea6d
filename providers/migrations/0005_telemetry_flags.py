from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("providers", "0004_machine_per_gpu_listing"),
    ]

    operations = [
        migrations.AddField(
            model_name="machineheartbeat",
            name="unverified_reason",
            field=models.CharField(blank=True, default="", max_length=300),
        ),
    ]
