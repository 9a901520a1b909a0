"""Each event carries the team that owns its object (console/accounts/scope.py); the events recorded before are
stamped with their objects' teams as they are now (one of an object gone since stays unstamped: admins read it)."""

from django.db import migrations, models
from django.db.models import Exists, OuterRef, Subquery
from django.db.models.functions import Substr

# Timeline kinds owned by a team, their model and the field that is its team: as event_teams says.
OWNED = (("model", "catalog", "Model", "team_id"), ("adapter", "catalog", "Adapter", "team_id"),
         ("route", "routes", "Route", "team_id"), ("team", "accounts", "Team", "pk"))


def stamp(apps, schema_editor):
    Event = apps.get_model("events", "Event")
    Deployment = apps.get_model("deployments", "Deployment")
    of = Deployment.objects.filter(name=OuterRef("deployment"))
    Event.objects.exclude(deployment="").filter(Exists(of)).update(team=Subquery(of.values("team_id")[:1]))
    for kind, app, model, team in OWNED:
        rows = apps.get_model(app, model).objects.filter(name=Substr(OuterRef("object"), len(kind) + 2))
        Event.objects.filter(object__startswith=f"{kind}/").filter(Exists(rows)).update(
            team=Subquery(rows.values(team)[:1]))


class Migration(migrations.Migration):

    dependencies = [
        ("events", "0001_timeline"),
        ("accounts", "0005_limits_and_quotas"),
        ("catalog", "0005_teams"),
        ("deployments", "0012_teams"),
        ("routes", "0002_teams"),
    ]

    operations = [
        migrations.AddField(
            model_name="event",
            name="team",
            field=models.IntegerField(blank=True, null=True),
        ),
        migrations.RunPython(stamp, migrations.RunPython.noop),
    ]
