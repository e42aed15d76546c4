"""Issue 22 without sockets: where settings came from, the embedded directory, the
fakes' predicates and transactions, the docs a newcomer reaches for."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tidings import App, CallQueuedListener, Job, Listener, ShouldQueue, after_commit, event
from tidings.cli.main import main, reading
from tidings.config import Settings
from tidings.errors import ConfigurationError
from tidings.notifications import MailMessage, Notification, route
from tidings.ops.embedded import EmbeddedNotRunning, ensure_embedded, home_dir, never_start
from tidings.testing import fake_notifications, fake_queue

ROOT = Path(__file__).resolve().parents[2]
KEY = "k" * 32


@pytest.fixture(autouse=True)
def no_connects(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a unit test tried to connect: {args[1:]!r}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


# -- 5: messages name where a setting was read from -----------------------------------


def test_the_missing_key_error_names_where_the_url_came_from() -> None:
    with pytest.raises(ConfigurationError) as caught:
        Settings.resolve({"redis_url": "redis://127.0.0.1:1/0"}, {}, given_in="settings.TIDINGS")
    text = str(caught.value)
    assert "settings.TIDINGS['redis_url']" in text and "settings.TIDINGS['key']" in text
    assert "TIDINGS_KEY" in text
    with pytest.raises(ConfigurationError, match="environment variable TIDINGS_REDIS_URL"):
        Settings.resolve({}, {"TIDINGS_REDIS_URL": "redis://127.0.0.1:1/0"})
    with pytest.raises(ConfigurationError, match=r"App\(key=\.\.\.\)"):
        Settings.resolve({"redis_url": "redis://127.0.0.1:1/0"}, {})


def test_settings_remember_their_sources() -> None:
    s = Settings.resolve(
        {"redis_url": "redis://127.0.0.1:1/0", "mail_url": "log://"},
        {"TIDINGS_KEY": KEY},
        given_in="settings.TIDINGS",
        labels={"mail_url": "Django's EMAIL_* settings"},
    )
    assert s.where("redis_url") == "settings.TIDINGS['redis_url']"
    assert s.where("key") == "the environment variable TIDINGS_KEY"
    assert s.where("mail_url") == "Django's EMAIL_* settings"
    assert s.where("sms_url") == "the default"
    with pytest.raises(ConfigurationError, match="read from the environment variable"):
        Settings.resolve(
            {"redis_url": "redis://x:1"}, {"TIDINGS_KEY": KEY, "TIDINGS_RETRY_AFTER": "soon"}
        )


def test_the_worker_refusal_names_django_settings_module(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TIDINGS_APP", "TIDINGS_ALLOWED_MODULES", "DJANGO_SETTINGS_MODULE"):
        monkeypatch.delenv(name, raising=False)
    done = CliRunner().invoke(main, [])
    assert done.exit_code == 78
    assert "DJANGO_SETTINGS_MODULE" in done.output and "-A module:app" in done.output


# -- 1: what an operator command reads -------------------------------------------------


def test_reading_masks_the_password() -> None:
    app = App(env=False, redis_url="redis://:s3cret-pw@127.0.0.1:1/0", key=KEY, prefix="p")
    shown = reading(app)
    assert "s3cret-pw" not in shown and "127.0.0.1:1/0" in shown
    assert "App(redis_url=...)" in shown and "prefix p" in shown


# -- 2: the embedded directory ------------------------------------------------------------


def test_the_embedded_directory_is_anchored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert home_dir(None, {}, anchor="/srv/app") == (Path("/srv/app/.tidings"), "beside /srv/app")
    assert home_dir(None, {"TIDINGS_HOME": "/var/t"}, anchor="/srv/app")[0] == Path("/var/t")
    assert home_dir("/x/h", {"TIDINGS_HOME": "/var/t"})[0] == Path("/x/h")
    assert home_dir(None, {})[0] == tmp_path / ".tidings"
    # An App made in this module: the directory of this module, whatever the cwd.
    app = App(env=False, redis_url="redis://127.0.0.1:1/0", key=KEY)
    here = Path(__file__).resolve().parent / ".tidings"
    assert app.settings.home == str(here) and app.settings.where("home") == f"beside {here.parent}"
    assert app.settings.mail_url == f"file://{here / 'outbox'}"


def test_an_operator_command_never_starts_an_embedded_server(tmp_path: Path) -> None:
    with never_start(), pytest.raises(EmbeddedNotRunning, match="never start"):
        ensure_embedded(tmp_path / ".tidings")
    assert not (tmp_path / ".tidings").exists()


# -- 7: fakes ------------------------------------------------------------------------------


@dataclass
class Signed:
    email: str


class SendWelcome(Listener, ShouldQueue):
    def handle(self, e: Signed) -> None:
        raise AssertionError("ran")


class SendAudit(Listener, ShouldQueue):
    after_commit = True

    def handle(self, e: Signed) -> None:
        raise AssertionError("ran")


@dataclass
class Ping(Job):
    n: int
    after_commit = True

    def handle(self) -> None: ...


@dataclass
class Hello(Notification, ShouldQueue):
    name: str
    after_commit = True

    def via(self, notifiable: Any) -> list[str]:
        return ["mail"]

    def to_mail(self, notifiable: Any) -> MailMessage:
        return MailMessage().subject("hi")


class Transaction:
    """A stand-in for a database transaction: callbacks run on commit, dropped on rollback."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], object]] | None = None

    def hook(self) -> after_commit.Deferrer | None:
        return self.callbacks.append if self.callbacks is not None else None

    def run(self, body: Callable[[], object], *, commit: bool) -> None:
        self.callbacks = []
        try:
            body()
        finally:
            pending, self.callbacks = self.callbacks, None
        if commit:
            for cb in pending:
                cb()


@pytest.fixture
def tx() -> Iterator[Transaction]:
    t = Transaction()
    after_commit.register_hook(t.hook)
    try:
        yield t
    finally:
        after_commit.unregister_hook(t.hook)


@pytest.fixture
def app() -> Iterator[App]:
    a = App(env=False, redis_url="redis://127.0.0.1:1/0", key=KEY, allowed_modules="tests")
    a.listen(Signed, SendWelcome)
    yield a
    a.close()


def test_every_queue_assertion_takes_a_predicate_and_a_listener_class(app: App) -> None:
    with fake_queue(app) as queue:
        event(Signed("ada@example.org"))
    queue.assert_pushed(SendWelcome)
    queue.assert_pushed(SendWelcome, lambda job: job.args[0].email == "ada@example.org")
    queue.assert_not_pushed(CallQueuedListener, lambda job: job.listener.endswith("SendAudit"))
    queue.assert_not_pushed(SendAudit)
    queue.assert_not_pushed(SendWelcome, lambda job: job.args[0].email == "bob@example.org")
    queue.assert_count(1, lambda job: isinstance(job, CallQueuedListener))
    queue.assert_nothing_pushed(lambda job: isinstance(job, Ping))
    queue.assert_pushed_on("default", SendWelcome, lambda job: True)
    with pytest.raises(AssertionError, match="SendWelcome was pushed 1"):
        queue.assert_not_pushed(SendWelcome)


def test_the_fakes_follow_the_transaction(app: App, tx: Transaction) -> None:
    app.listen(Signed, SendAudit)
    with fake_queue(app) as queue, fake_notifications(app) as sent:

        def body() -> None:
            event(Signed("ghost@example.org"))
            Ping(1).dispatch()
            route("mail", "ghost@example.org").notify(Hello("ghost"))

        tx.run(body, commit=False)
        queue.assert_not_pushed(SendAudit)
        queue.assert_not_pushed(Ping)
        sent.assert_nothing_sent()
        queue.assert_pushed(SendWelcome)  # not after_commit: pushed at the call

        tx.run(body, commit=True)
        queue.assert_pushed(SendAudit, times=1)
        queue.assert_pushed(Ping, lambda job: job.n == 1, times=1)
        sent.assert_sent_on_demand(Hello, lambda n, note: note.name == "ghost")
        sent.assert_count(1, lambda n, note, channels: channels == ["mail"])
    with fake_queue(app, follow_transactions=False) as queue:
        tx.run(lambda: Ping(2).dispatch(), commit=False)
        queue.assert_pushed(Ping, lambda job: job.n == 2)


# -- 6, 8, 9, 10: the docs and the README ---------------------------------------------


def _page(name: str) -> str:
    return (ROOT / "docs" / name).read_text()


def test_a_docs_page_per_channel_family_in_the_nav() -> None:
    text = (ROOT / "mkdocs.yml").read_text().split("nav:", 1)[1]
    for page in ("channels/mail.md", "channels/sms.md", "channels/webhooks.md", "slack.md",
                 "database-notifications.md"):  # fmt: skip
        assert page in text and (ROOT / "docs" / page).exists()
    hooks = _page("channels/webhooks.md")
    for needed in ("to_webhook", "WebhookMessage(", "type=", 'route("webhook", ',
                   "from tidings.notifications import", "webhook_url", "verify_webhook",
                   "webhook_allow_private"):  # fmt: skip
        assert needed in hooks, needed
    mail = _page("channels/mail.md")
    assert "EMAIL_HOST" in mail and "notification_tries" in mail


def test_testing_md_imports_in_every_example_and_shows_pytest_django() -> None:
    text = _page("testing.md")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        assert "import " in block, block
    assert "django_capture_on_commit_callbacks" in text
    assert "Recommended test settings" in text and 'os.environ["TIDINGS_KEY"]' in text
    assert "assert_not_pushed(SendWelcome)" in text


def test_the_django_tutorial_reaches_the_app_and_explains_the_after_commit_id() -> None:
    text = _page("tutorials/django.md")
    assert "get_app()" in text and "App.current()" in text and "job_status" in text
    assert "no job with that id" in text and "failed()" in text
    assert 'os.environ["TIDINGS_KEY"]' not in text.replace("`os.environ[...]`", "")
    assert (
        "EMAIL_HOST" in text
        and "DJANGO_SETTINGS_MODULE=mysite.settings notify-worker failed list" in text
    )


def test_model_not_found_says_forget_not_retry() -> None:
    section = _page("errors.md").split("### ModelNotFound", 1)[1].split("###", 1)[0]
    assert "forgotten, not retried" in section and "failed forget" in section


def test_the_readme_has_no_dangling_fragment() -> None:
    text = (ROOT / "README.md").read_text()
    assert text.count("cannot be cancelled (it runs") == 1
    assert "  cannot be cancelled (it runs on one of the worker's job threads)" not in text
