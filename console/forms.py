"""Console forms: they check the shape of what an owner typed. Whether the
action is allowed (ownership, case state, evidence for a release) is the
recovery service's decision, not the form's."""

from __future__ import annotations

from django import forms

from config import limits
from recovery.models import DecisionAction


class InspectionChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj) -> str:
        return f"{obj.created_at:%Y-%m-%d %H:%M:%SZ} · {obj.actor} · sha256 {obj.sha256[:12]}…"


# What each action does, in the words of DESIGN.md's recovery flow. No
# default: finalizing or releasing is not something to do by leaving a
# select alone.
ACTION_CHOICES = [
    ("", "— choose an action —"),
    (
        DecisionAction.FINALIZE_ORPHAN,
        "finalize_orphan — close the ticket as orphaned, no invented result",
    ),
    (
        DecisionAction.AUTHORIZE_RERUN,
        "authorize_rerun — orphan it and admit a re-run under a new identity: the same "
        "input, on the same endpoint with its current budget",
    ),
    (DecisionAction.KEEP_QUARANTINED, "keep_quarantined — change nothing; the case stays open"),
    (DecisionAction.RELEASE, "release — the turn is proven ended (needs evidence); ticket fails"),
]


class DecisionForm(forms.Form):
    action = forms.ChoiceField(choices=ACTION_CHOICES)
    inspection = InspectionChoiceField(
        queryset=None, empty_label=None, help_text="The inspection this decision rests on."
    )
    rationale = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), max_length=limits.TEXT_CHARS
    )
    evidence = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        max_length=limits.TEXT_CHARS,
        help_text="Required to release: what shows the uncertain turn ended.",
    )

    def __init__(self, *args, inspections, **kwargs):
        super().__init__(*args, **kwargs)
        # Only this case's inspections: a decision must rest on one of them.
        self.fields["inspection"].queryset = inspections


class LessonForm(forms.Form):
    what_failed = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}), max_length=limits.TEXT_CHARS
    )
    evidence = forms.CharField(
        label="Evidence that made the diagnosis possible",
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=limits.TEXT_CHARS,
    )
    prevention = forms.CharField(
        label="What would prevent it",
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=limits.TEXT_CHARS,
    )
