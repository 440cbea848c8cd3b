from django.contrib.auth import views as auth_views
from django.urls import path

from . import governance, live, views, workers

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.dashboard, name="dashboard"),
    path("tickets/", views.ticket_list, name="ticket_list"),
    path("tickets/bulk/", views.ticket_bulk, name="ticket_bulk"),
    path("tickets/<uuid:ticket_id>/", views.ticket_detail, name="ticket_detail"),
    path("tickets/<uuid:ticket_id>/cancel/", views.ticket_cancel, name="ticket_cancel"),
    path("tickets/<uuid:ticket_id>/approve/", views.ticket_approve, name="ticket_approve"),
    path("tickets/<uuid:ticket_id>/retry/", views.ticket_retry, name="ticket_retry"),
    path("tickets/<uuid:ticket_id>/obligation/", views.ticket_obligation, name="ticket_obligation"),
    # A trace id is any 1 to 64 printable characters, "/" included.
    path("traces/<path:trace_id>/", views.trace_detail, name="trace_detail"),
    path("endpoints/", views.endpoint_list, name="endpoint_list"),
    path("endpoints/<str:address>/", governance.endpoint_detail, name="endpoint_detail"),
    path("endpoints/<str:address>/pause/", views.endpoint_pause, name="endpoint_pause"),
    path(
        "endpoints/<str:address>/approvals/<uuid:ticket_id>/<str:call_id>/",
        views.agent_approval,
        name="agent_approval",
    ),
    path("endpoints/<str:address>/propose/", governance.endpoint_propose, name="endpoint_propose"),
    path(
        "endpoints/<str:address>/rollback/", governance.endpoint_rollback, name="endpoint_rollback"
    ),
    path("proposals/<uuid:proposal_id>/", governance.proposal_detail, name="proposal_detail"),
    path(
        "proposals/<uuid:proposal_id>/review/", governance.proposal_review, name="proposal_review"
    ),
    path("recovery/<uuid:case_id>/propose/", governance.case_propose, name="case_propose"),
    path("recovery/", views.case_list, name="case_list"),
    path("recovery/<uuid:case_id>/", views.case_detail, name="case_detail"),
    path("recovery/<uuid:case_id>/inspections/", views.case_inspect, name="case_inspect"),
    path("recovery/<uuid:case_id>/decisions/", views.case_decide, name="case_decide"),
    path("recovery/<uuid:case_id>/lesson/", views.case_lesson, name="case_lesson"),
    path("lessons/", views.lesson_list, name="lesson_list"),
    path("obligations/", views.obligation_list, name="obligation_list"),
    path("workers/", workers.worker_list, name="worker_list"),
    path("workers/<str:name>/consuming/", workers.worker_consuming, name="worker_consuming"),
    path("live/", live.watch, name="live_watch"),
    path("preferences/theme/", views.theme, name="theme"),
    path(
        "recovery/<uuid:case_id>/stop-process/",
        workers.case_stop_process,
        name="case_stop_process",
    ),
]
