from dataclasses import dataclass

from accounts.models import User


@dataclass
class UserRegistered:
    user: User
