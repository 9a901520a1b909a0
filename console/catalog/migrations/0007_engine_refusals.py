"""Model.engine_refusals: what each engine's capability check refuses for a model, read from its files. Models
registered before are read once here where their files still can be (else they stay unrefused, as before)."""

from django.db import migrations, models


def read_refusals(apps, schema_editor):
    from django.conf import settings

    from agent.artifacts import ArtifactError, inspect_model_dir
    from agent.artifacts.capability import model_shape
    from agent.engines import refusals

    Model = apps.get_model("catalog", "Model")
    for row in Model.objects.all():
        try:
            found = refusals(model_shape(inspect_model_dir(row.path, roots=settings.MODEL_ROOTS),
                                         settings.MODEL_ROOTS))
        except (ArtifactError, OSError):
            continue
        if found:
            Model.objects.filter(pk=row.pk).update(engine_refusals=found)


class Migration(migrations.Migration):

    dependencies = [
        ('catalog', '0006_model_shape'),
    ]

    operations = [
        migrations.AddField(
            model_name='model',
            name='engine_refusals',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(read_refusals, migrations.RunPython.noop),
    ]
