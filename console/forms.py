"""Console forms: they check the shape of what an owner typed. Whether the
action is allowed (ownership, case state, evidence for a release) is the
recovery service's decision, not the form's."""

from __future__ import annotations

import json

from django import forms

from core import limits
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
        "authorize_rerun — orphan it and admit a re-run under a new identity, with the "
        "input and budget below",
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

    rerun_input = forms.CharField(
        label="Re-run input (JSON object)",
        widget=forms.Textarea(attrs={"rows": 4, "class": "mono"}),
        # No cap of its own: admission holds the input to TICKET_MAX_INPUT_BYTES.
        required=False,
        help_text="authorize_rerun only: what the re-run gets; blank keeps the original's.",
    )
    rerun_budget_s = forms.IntegerField(
        label="Re-run turn budget, seconds",
        required=False,
        min_value=1,
        help_text="authorize_rerun only: blank keeps the endpoint's budget.",
    )

    def __init__(self, *args, inspections, budget_cap: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        # Only this case's inspections: a decision must rest on one of them.
        self.fields["inspection"].queryset = inspections
        if budget_cap is not None:
            self.fields["rerun_budget_s"].widget.attrs["max"] = int(budget_cap)
            self.fields[
                "rerun_budget_s"
            ].help_text = f"authorize_rerun only: blank keeps the endpoint's {budget_cap:g} s."

    def clean_rerun_input(self):
        raw = self.cleaned_data["rerun_input"].strip()
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise forms.ValidationError(f"not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("the input must be a JSON object")
        return value


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
