"""An app with no authorisation callback (the broadcast server refuses other addresses)."""

from tidings import App

app = App.from_env()
