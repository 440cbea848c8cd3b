"""Console forms: they check the shape of what an owner typed. Whether the
action is allowed (ownership, case state, evidence for a release) is the
recovery service's decision, not the form's."""

from __future__ import annotations

import json
from datetime import datetime

from django import forms

from core import limits
from core.errors import Invalid
from core.times import as_utc
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
        except RecursionError:  # json's own limit; admission refuses past TICKET_MAX_JSON_DEPTH
            raise forms.ValidationError("the input is nested too deeply") from None
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


class LessonProposalMixin(forms.Form):
    """What a lesson may propose for the endpoint's next generation: a turn
    budget and notes for the next run (blank: no change proposed)."""

    propose_turn_budget_s = forms.FloatField(
        label="Propose a turn budget (seconds)",
        required=False,
        min_value=0.001,
        help_text="A change of the endpoint, reviewed by another owner or staff.",
    )
    propose_notes = forms.CharField(
        label="Propose notes for the next run",
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        max_length=limits.NOTE_CHARS,
        help_text="Every later turn's runner is handed them (an agent: in its instructions).",
    )
    # The generation the form was drawn for: a proposal is made against it.
    proposal_generation = forms.IntegerField(widget=forms.HiddenInput, min_value=1, required=False)

    def clean(self):
        data = super().clean()
        wants = data.get("propose_turn_budget_s") is not None or data.get("propose_notes")
        if wants and not data.get("proposal_generation"):
            raise forms.ValidationError("the endpoint's generation is missing: reload the page")
        return data

    def proposal(self) -> dict | None:
        """The proposal the form asks for, or None."""
        data = self.cleaned_data
        changes = {}
        if data.get("propose_turn_budget_s") is not None:
            changes["turn_budget_s"] = data["propose_turn_budget_s"]
        if data.get("propose_notes"):
            changes["notes"] = data["propose_notes"]
        if not changes:
            return None
        return {"generation": data["proposal_generation"], "changes": changes}


class LessonWithProposalForm(LessonForm, LessonProposalMixin):
    def lesson_fields(self) -> dict:
        return {k: self.cleaned_data[k] for k in ("what_failed", "evidence", "prevention")}


BUSY_CHOICES = [("enqueue", "enqueue"), ("reject", "reject"), ("interrupt", "interrupt")]


class ChangeForm(forms.Form):
    """A proposed change of an endpoint's configuration, prefilled with the
    current generation's values; only the fields changed are proposed."""

    turn_budget_s = forms.FloatField(label="Turn budget (s)", min_value=0.001)
    interrupt_grace_s = forms.FloatField(label="Interrupt grace (s)", min_value=0.001)
    heartbeat_timeout_s = forms.FloatField(label="Heartbeat timeout (s)", min_value=0.001)
    busy_policy = forms.ChoiceField(choices=BUSY_CHOICES)
    requires_approval = forms.TypedChoiceField(
        label="Needs approval",
        choices=[("no", "no"), ("yes", "yes")],
        coerce=lambda v: v == "yes",
    )
    notes = forms.CharField(
        label="Notes for the next run",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        max_length=limits.NOTE_CHARS,
    )
    reason = forms.CharField(
        label="Why", widget=forms.Textarea(attrs={"rows": 2}), max_length=limits.NOTE_CHARS
    )
    generation = forms.IntegerField(widget=forms.HiddenInput, min_value=1)

    FIELDS = (
        "turn_budget_s",
        "interrupt_grace_s",
        "heartbeat_timeout_s",
        "busy_policy",
        "requires_approval",
        "notes",
    )

    @classmethod
    def for_endpoint(cls, endpoint, **kwargs):
        initial = {name: getattr(endpoint, name) for name in cls.FIELDS}
        initial["requires_approval"] = "yes" if endpoint.requires_approval else "no"
        initial["generation"] = endpoint.generation
        return cls(initial=initial, prefix="change", **kwargs)

    def changes(self, endpoint) -> dict:
        return {
            name: self.cleaned_data[name]
            for name in self.FIELDS
            if self.cleaned_data[name] != getattr(endpoint, name)
        }


class ReviewForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), max_length=limits.NOTE_CHARS)


class RollbackForm(forms.Form):
    to_generation = forms.IntegerField(widget=forms.HiddenInput, min_value=1)
    generation = forms.IntegerField(widget=forms.HiddenInput, min_value=1)
    reason = forms.CharField(max_length=limits.NOTE_CHARS)


def utc_param(raw: str, name: str) -> datetime | None:
    """A time field typed as UTC (``YYYY-MM-DD HH:MM[:SS]``, a ``T`` or a
    trailing ``Z`` accepted); a naive value is UTC, never local time."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        raise Invalid(
            f"{name}: {raw!r} is not a date and time (UTC, like 2026-11-30 14:05)"
        ) from None
    return as_utc(value, name)


def retry_changes(post) -> tuple[dict | None, int | None]:
    """The optional input and budget a retry form gives: blank means keep
    the ticket's input and the endpoint's budget. Invalid on bad JSON."""
    raw_input = post.get("input", "").strip()
    raw_budget = post.get("budget_s", "").strip()
    new_input = None
    if raw_input:
        try:
            new_input = json.loads(raw_input)
        except ValueError as exc:
            raise Invalid(f"the input is not JSON: {exc}") from None
        except RecursionError:  # json's own limit; admission refuses past TICKET_MAX_JSON_DEPTH
            raise Invalid("the input is nested too deeply") from None
        if not isinstance(new_input, dict):
            raise Invalid("the input must be a JSON object")
    budget = None
    if raw_budget:
        try:
            budget = int(raw_budget)
        except ValueError:
            raise Invalid("the budget is a whole number of seconds") from None
    return new_input, budget
