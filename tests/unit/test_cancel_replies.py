"""Every answer app.cancel can give has a code and a sentence on the dashboard's job page
(a reply without one would read as "No such job" after the Cancel button), and a note
for ``notify-worker cancel`` when it changed nothing."""

from __future__ import annotations

from tidings.dashboard.web import _CANCEL_CODES, CANCEL_OUTCOMES
from tidings.moves.control import _CANCEL_REPLIES


def test_every_cancel_answer_has_a_dashboard_code_and_sentence() -> None:
    said = {text for text, _changed, _note in _CANCEL_REPLIES.values()}
    assert "failing" in said
    assert said <= set(_CANCEL_CODES)
    for text in said:
        assert CANCEL_OUTCOMES[_CANCEL_CODES[text]]


def test_only_a_cancel_that_changed_something_says_changed() -> None:
    changed = {text for text, ch, _note in _CANCEL_REPLIES.values() if ch}
    assert changed == {"cancelled", "cancelling"}


def test_a_cancel_that_changed_nothing_says_why_and_one_that_did_does_not() -> None:
    for text, changed, note in _CANCEL_REPLIES.values():
        assert bool(note) is not changed, text
        assert "nothing changed" in note or changed, text
