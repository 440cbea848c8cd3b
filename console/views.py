"""Operator console: plain function views; authorisation lives here."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from endpoints.models import Endpoint
from tickets.models import Ticket


@login_required
def dashboard(request):
    return render(
        request,
        "console/dashboard.html",
        {
            "endpoints": Endpoint.objects.order_by("address"),
            "recent": Ticket.objects.select_related("endpoint").order_by("-id")[:20],
        },
    )
