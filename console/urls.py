from django.contrib.auth import views as auth_views
from django.urls import path

from .views import (
    cases,
    dashboard,
    endpoints,
    live,
    obligations,
    preferences,
    proposals,
    tickets,
    traces,
    workers,
)

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", dashboard.dashboard, name="dashboard"),
    path("tickets/", tickets.ticket_list, name="ticket_list"),
    path("tickets/bulk/", tickets.ticket_bulk, name="ticket_bulk"),
    path("tickets/<uuid:ticket_id>/", tickets.ticket_detail, name="ticket_detail"),
    path("tickets/<uuid:ticket_id>/cancel/", tickets.ticket_cancel, name="ticket_cancel"),
    path("tickets/<uuid:ticket_id>/approve/", tickets.ticket_approve, name="ticket_approve"),
    path("tickets/<uuid:ticket_id>/retry/", tickets.ticket_retry, name="ticket_retry"),
    path(
        "tickets/<uuid:ticket_id>/obligation/",
        tickets.ticket_obligation,
        name="ticket_obligation",
    ),
    # A trace id is any 1 to 64 printable characters, "/" included.
    path("traces/<path:trace_id>/", traces.trace_detail, name="trace_detail"),
    path("endpoints/", endpoints.endpoint_list, name="endpoint_list"),
    path("endpoints/<str:address>/", endpoints.endpoint_detail, name="endpoint_detail"),
    path("endpoints/<str:address>/pause/", endpoints.endpoint_pause, name="endpoint_pause"),
    path(
        "endpoints/<str:address>/approvals/<uuid:ticket_id>/<str:call_id>/",
        endpoints.agent_approval,
        name="agent_approval",
    ),
    path("endpoints/<str:address>/propose/", endpoints.endpoint_propose, name="endpoint_propose"),
    path(
        "endpoints/<str:address>/rollback/", endpoints.endpoint_rollback, name="endpoint_rollback"
    ),
    path("proposals/", proposals.proposal_list, name="proposal_list"),
    path("proposals/<uuid:proposal_id>/", proposals.proposal_detail, name="proposal_detail"),
    path("proposals/<uuid:proposal_id>/review/", proposals.proposal_review, name="proposal_review"),
    path("recovery/<uuid:case_id>/propose/", cases.case_propose, name="case_propose"),
    path("recovery/", cases.case_list, name="case_list"),
    path("recovery/<uuid:case_id>/", cases.case_detail, name="case_detail"),
    path("recovery/<uuid:case_id>/inspections/", cases.case_inspect, name="case_inspect"),
    path("recovery/<uuid:case_id>/decisions/", cases.case_decide, name="case_decide"),
    path("recovery/<uuid:case_id>/lesson/", cases.case_lesson, name="case_lesson"),
    path("lessons/", cases.lesson_list, name="lesson_list"),
    path("obligations/", obligations.obligation_list, name="obligation_list"),
    path("workers/", workers.worker_list, name="worker_list"),
    path("workers/<str:name>/consuming/", workers.worker_consuming, name="worker_consuming"),
    path("live/", live.watch, name="live_watch"),
    path("preferences/theme/", preferences.theme, name="theme"),
    path(
        "recovery/<uuid:case_id>/stop-process/",
        cases.case_stop_process,
        name="case_stop_process",
    ),
    path(
        "recovery/<uuid:case_id>/stop-process/panel/",
        cases.case_stop_panel,
        name="case_stop_panel",
    ),
]
