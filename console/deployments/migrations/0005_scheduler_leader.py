"""The scheduler leader's row (console/control/leader.py): its epoch is the fencing token of every pass.

Raw SQL, not a model: the row is read and written only by leader.py, with SELECT ... FOR UPDATE, and it has no
place in the ORM's state (nothing to make migrations for). The same DDL works on SQLite and PostgreSQL."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0004_replica_observed_reason"),
    ]

    operations = [
        migrations.RunSQL(
            sql=[
                "CREATE TABLE deployments_schedulerleader ("
                " id integer NOT NULL PRIMARY KEY,"
                " epoch bigint NOT NULL,"
                " holder varchar(300) NOT NULL,"
                " since double precision NOT NULL)",
                "INSERT INTO deployments_schedulerleader (id, epoch, holder, since) VALUES (1, 0, '', 0)",
            ],
            reverse_sql=["DROP TABLE deployments_schedulerleader"],
        ),
    ]
