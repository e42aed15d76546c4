from accounts.models import User
from tidings import ShouldQueue
from tidings.notifications import MailMessage, Notification


class Welcome(Notification, ShouldQueue):
    tries = 3

    def via(self, user: User) -> list[str]:
        return ["mail"]

    def to_mail(self, user: User) -> MailMessage:
        return (
            MailMessage()
            .subject("Welcome to myapp")
            .greeting(f"Hello {user.name}!")
            .line("Your account is ready.")
        )
