import uuid

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("providers", "0005_telemetry_flags"),
    ]

    operations = [
        migrations.CreateModel(
            name="AgentCommand",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("status", "status"),
                            ("launch", "launch"),
                            ("describe", "describe"),
                            ("terminate", "terminate"),
                            ("find", "find by order"),
                        ],
                        max_length=16,
                    ),
                ),
                ("method", models.CharField(max_length=8)),
                ("target", models.CharField(max_length=512)),
                ("body", models.TextField(blank=True, default="")),
                ("headers", models.JSONField(default=dict)),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("pending", "waiting for the agent's poll"),
                            ("delivered", "handed to the agent"),
                            ("answered", "answered"),
                            ("expired", "the broker stopped waiting"),
                        ],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("created_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
                ("answered_at", models.DateTimeField(blank=True, null=True)),
                ("answer_status", models.PositiveSmallIntegerField(blank=True, null=True)),
                ("answer", models.JSONField(blank=True, null=True)),
                (
                    "machine",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="commands",
                        to="providers.machine",
                    ),
                ),
            ],
            options={
                "indexes": [models.Index(fields=["machine", "state", "created_at"], name="agent_command_queue")],
            },
        ),
        migrations.CreateModel(
            name="AgentPollWindow",
            fields=[
                (
                    "machine",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="poll_window",
                        serialize=False,
                        to="providers.machine",
                    ),
                ),
                ("window_start", models.DateTimeField(blank=True, null=True)),
                ("window_count", models.PositiveIntegerField(default=0)),
            ],
        ),
    ]
