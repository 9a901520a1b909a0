from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from console.accounts import invite_views
from console.accounts import team_views as teams
from console.accounts import views as tokens
from console.alerts import views as alerts
from console.api import api
from console.catalog import views as catalog
from console.deployments import deploy_views
from console.deployments import views as deployments
from console.events import audit_views
from console.events import views as events
from console.fleet import views as fleet
from console.routes import views as routes
from console.series import views as series
from console.usage import views as usage

urlpatterns = [
    path("", fleet.dashboard, name="dashboard"),
    path("models/", catalog.models_page, name="models"),
    path("models/register/", catalog.register, name="model-register"),
    path("models/estimate/", catalog.estimate_preview, name="model-estimate"),
    path("models/<str:name>/deploy/", deploy_views.deploy, name="model-deploy"),
    path("models/<str:name>/edit/", catalog.edit_model, name="model-edit"),
    path("deployments/<str:name>/", deployments.deployment_page, name="deployment"),
    path("deployments/<str:name>/status/", deployments.status, name="deployment-status"),
    path("deployments/<str:name>/logs/", deployments.replica_log, name="deployment-logs"),
    path("deployments/<str:name>/policy/", deployments.update_policy, name="deployment-policy"),
    path("deployments/<str:name>/delete/", deployments.delete, name="deployment-delete"),
    path("deployments/<str:name>/charts/", series.deployment_charts, name="deployment-charts"),
    path("fleet/charts/", series.fleet_charts, name="fleet-charts"),
    path("hosts/<str:name>/charts/", series.host_charts, name="host-charts"),
    path("deployments/<str:name>/adapters/", deployments.register_adapter, name="adapter-register"),
    path("adapters/<str:adapter>/delete/", deployments.delete_adapter, name="adapter-delete"),
    path("adapters/<str:adapter>/edit/", catalog.edit_adapter, name="adapter-edit"),
    path("routes/", routes.routes_page, name="routes"),
    path("routes/branch/", routes.branch_row, name="route-branch"),
    path("routes/<str:name>/edit/", routes.edit, name="route-edit"),
    path("routes/<str:name>/delete/", routes.delete, name="route-delete"),
    path("events/", events.events_page, name="events"),
    path("audit/", audit_views.audit_page, name="audit"),
    path("alerts/banner/", alerts.banner, name="alerts-banner"),
    path("events/recent/", events.recent, name="events-recent"),
    path("hosts/<str:name>/", fleet.host_page, name="host"),
    path("hosts/<str:name>/placement/", fleet.update_placement, name="host-placement"),
    path("scheduler/strategy/", fleet.update_strategy, name="scheduler-strategy"),
    path("usage/", usage.usage, name="usage"),
    path("teams/", teams.teams_page, name="teams"),
    path("teams/new/", teams.create, name="team-create"),
    path("teams/<str:name>/limits/", teams.change_limits, name="team-limits"),
    path("teams/<str:name>/members/", teams.add_member, name="team-member-add"),
    path("teams/<str:name>/invite/", invite_views.invite, name="team-invite"),
    path("teams/<str:name>/members/<str:user>/remove/", teams.remove_member, name="team-member-remove"),
    path("tokens/", tokens.tokens_page, name="tokens"),
    path("tokens/new/", tokens.create, name="token-create"),
    path("tokens/<int:token_id>/revoke/", tokens.revoke, name="token-revoke"),
    path("tokens/<int:token_id>/limits/", tokens.change_limits, name="token-limits"),
    path("tokens/agents/", tokens.issue_agent, name="agent-credential-issue"),
    path("tokens/agents/<path:host_name>/revoke/", tokens.revoke_agent, name="agent-credential-revoke"),
    path("api/v1/", api.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("accounts/invite/<uidb64>/<token>/", invite_views.AcceptInvite.as_view(), name="invite-accept"),
    path("admin/", admin.site.urls),
]
