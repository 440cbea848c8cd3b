"""The API's authentication: a Bearer API key (accounts/keys.py), and the
caller's share of the web threads taken as it is recognised."""

from __future__ import annotations

from django.http import HttpRequest
from ninja.security import HttpBearer

from core import fairshare

from .keys import user_for_key


class ApiKeyAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        # Failed authentications count per client address: an address past
        # RATE_LIMIT_FAILED_AUTH is 429 before its next key is looked up.
        address = fairshare.client_address(request)
        user = user_for_key(token, before_lookup=lambda: fairshare.check_failed_auth(address))
        if user is None:
            fairshare.count_failed_auth(address)
        else:
            request.user = user
            # Its share of the web threads (429 rate_limited over it); the
            # lease is released by FairShareMiddleware when the request answers.
            fairshare.enter_request(request, user)
        return user
