"""Notifications: Notification, Notifiable, messages, on-demand routes and channels.

::

    class InvoicePaid(Notification, ShouldQueue):
        def via(self, notifiable): return ["mail", "sms", "webhook"]
        def to_mail(self, notifiable): return MailMessage().subject("Paid").line("Thanks!")

    user.notify(InvoicePaid(invoice))
"""

from tidings.notifications.channels.database import DatabaseNotification
from tidings.notifications.channels.slack import SlackMessage
from tidings.notifications.events import (
    NotificationDelayed,
    NotificationDigested,
    NotificationFailed,
    NotificationSending,
    NotificationSent,
    NotificationSkipped,
)
from tidings.notifications.messages import (
    MailMessage,
    SmsMessage,
    WebhookEndpoint,
    WebhookMessage,
)
from tidings.notifications.notification import AnonymousNotifiable, Notifiable, Notification, route
from tidings.notifications.queued import SendQueuedNotification
from tidings.notifications.webhooks import verify_webhook

__all__ = [
    "AnonymousNotifiable",
    "DatabaseNotification",
    "MailMessage",
    "Notifiable",
    "Notification",
    "NotificationDelayed",
    "NotificationDigested",
    "NotificationFailed",
    "NotificationSending",
    "NotificationSent",
    "NotificationSkipped",
    "SendQueuedNotification",
    "SlackMessage",
    "SmsMessage",
    "WebhookEndpoint",
    "WebhookMessage",
    "route",
    "verify_webhook",
]
