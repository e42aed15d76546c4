"""Notification transports: mail (SMTP, file, log), SMS (Twilio, Vonage, log), webhooks.

Transports deliver a finished message and know nothing of notifiables or the queue;
the channel layer (:mod:`tidings.notifications.channels.manager`) routes a
notification to them. Each ``send`` returns a :class:`DeliveryResult` or raises a
:class:`~tidings.errors.TransientChannelError` (retry) or
:class:`~tidings.errors.PermanentChannelError` (give up).
"""

from tidings.notifications.channels.base import DeliveryResult, parse_retry_after, redact
from tidings.notifications.channels.mail import MailTransport, mail_transport_from_url
from tidings.notifications.channels.sms import SmsTransport, sms_transport_from_url
from tidings.notifications.channels.webhook import WebhookGoneError, WebhookTransport

__all__ = [
    "DeliveryResult",
    "MailTransport",
    "SmsTransport",
    "WebhookGoneError",
    "WebhookTransport",
    "mail_transport_from_url",
    "parse_retry_after",
    "redact",
    "sms_transport_from_url",
]
