from django.db import models

from tidings.notifications import Notifiable


class User(Notifiable, models.Model):
    """A Django model that receives notifications: queued by primary key, reloaded in
    the worker."""

    email = models.EmailField(unique=True)
    name = models.CharField(max_length=100)
    welcomed = models.BooleanField(default=False)
