"""The check of a fair group key (used at dispatch and by the operator's commands)."""

from __future__ import annotations

from tidings.errors import ValidationError

GROUP_MAX_BYTES = 256


def check_group(value: object, where: str = "on_group()") -> str:
    """``value`` as a group key: a non-empty str of at most 256 UTF-8 bytes, without
    control characters.

    Raises:
        ValidationError: anything else (``where`` names the call or hook to fix).
    """
    if not isinstance(value, str):
        raise ValidationError(f"{where}: a group key is a str, not {type(value).__name__}")
    if not value:
        raise ValidationError(f"{where}: the group key is empty")
    size = len(value.encode("utf-8", errors="surrogatepass"))
    if size > GROUP_MAX_BYTES:
        raise ValidationError(
            f"{where}: the group key is {size} bytes; at most {GROUP_MAX_BYTES} are allowed"
        )
    for ch in value:
        code = ord(ch)
        if code < 32 or 127 <= code < 160 or 0xD800 <= code < 0xE000:
            raise ValidationError(
                f"{where}: the group key {ascii(value)[:80]} holds a control character "
                f"(U+{code:04X}); group keys are shown on terminals and the dashboard"
            )
    return value
