"""The workers' App of the chain-on-a-connection tests: the workflows app plus a named
connection ``other`` (``WF_OTHER_URL``, another database of the same Redis)."""

from __future__ import annotations

import os

from tests.integration.workflows_app import KEY, WorkflowApp
from tidings import App


def make_app(redis_url: str, prefix: str, other_url: str, retry_after: float = 2.0) -> App:
    return WorkflowApp(
        redis_url=redis_url,
        key=KEY,
        prefix=prefix,
        retry_after=retry_after,
        allowed_modules=["tests", "tidings"],
        env=False,
        connections={"other": other_url},
    )


app: App | None = None
if os.environ.get("WF_REDIS_URL"):
    app = make_app(
        os.environ["WF_REDIS_URL"],
        os.environ["WF_PREFIX"],
        os.environ["WF_OTHER_URL"],
        float(os.environ.get("WF_RETRY_AFTER", "2")),
    )
