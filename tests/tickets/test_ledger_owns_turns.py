"""tickets/0007: a database migrated while the runtime owned the turns has
their content types under ``runtime``; the migration renames them in place,
so the permissions pointing at them stay given."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection

pytestmark = pytest.mark.django_db

migration = importlib.import_module("tickets.migrations.0007_ledger_owns_turns")


class _Editor:
    connection = connection


def test_the_old_owners_content_types_are_renamed_with_their_permissions():
    turn = ContentType.objects.get_for_model(apps.get_model("tickets", "Turn"))
    view = Permission.objects.get(content_type=turn, codename="view_turn")
    # As a database of the previous release has it.
    ContentType.objects.filter(app_label="tickets", model__in=migration.MODELS).update(
        app_label="runtime"
    )
    ContentType.objects.clear_cache()

    migration._relabel("runtime", "tickets")(apps, _Editor())

    ContentType.objects.clear_cache()
    assert ContentType.objects.get(app_label="tickets", model="turn").id == turn.id
    assert not ContentType.objects.filter(app_label="runtime", model__in=migration.MODELS)
    assert Permission.objects.get(id=view.id).content_type_id == turn.id


def test_a_content_type_the_new_release_made_already_is_left_alone():
    turn = ContentType.objects.get_for_model(apps.get_model("tickets", "Turn"))
    old = ContentType.objects.create(app_label="runtime", model="turn")

    migration._relabel("runtime", "tickets")(apps, _Editor())

    assert ContentType.objects.get(id=old.id).app_label == "runtime"
    assert ContentType.objects.get(id=turn.id).app_label == "tickets"
