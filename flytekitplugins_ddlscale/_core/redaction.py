"""Keep credentials out of logs, errors and outputs: a credential is registered (:func:`register_secret`) when
read; :func:`redact` masks registered values and auth-header shapes in every error's message, and from the first
:func:`install_redaction` in log records too. Importing this module changes nothing outside it."""
import logging
import re
import threading
from typing import Set

MASK = "***"
_MIN_SECRET_LENGTH = 4

_lock = threading.Lock()
_secrets: Set[str] = set()

_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"]+@")
"""``scheme://user:password@``: the userinfo of a URL, whether or not its password was registered."""
_HEADER_PATTERNS = (
    re.compile(r"(?i)(authorization\s*[:=]\s*['\"]?bearer\s+)[^\s'\",}]+"),
    re.compile(r"(?i)(x-domino-api-key\s*['\"]?\s*[:=]\s*['\"]?)[^\s'\",}]+"),
    re.compile(r"(?i)(\"?(?:token|api_key|apikey|access_token)\"?\s*[:=]\s*['\"]?)[^\s'\",}]+"),
)


def register_secret(value: str) -> None:
    """Remember ``value`` so that :func:`redact` masks it from now on."""
    if isinstance(value, str) and len(value) >= _MIN_SECRET_LENGTH:
        with _lock:
            _secrets.add(value)


def mask_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@`` (the rest kept, to say which URL)."""
    return _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", url)


def holds_secret(text: str) -> bool:
    """Whether ``text`` contains a registered secret or a URL's ``user:password@``."""
    with _lock:
        known = list(_secrets)
    return any(secret in text for secret in known) or mask_userinfo(text) != text


def redact(text: object) -> str:
    """``str(text)`` with every registered secret, URL userinfo and auth-header value masked."""
    out = str(text)
    with _lock:
        known = sorted(_secrets, key=len, reverse=True)
    for secret in known:
        if secret in out:
            out = out.replace(secret, MASK)
    out = mask_userinfo(out)
    for pattern in _HEADER_PATTERNS:
        out = pattern.sub(lambda m: m.group(1) + MASK, out)
    return out


LOGGER_NAME = "flytekitplugins_ddlscale"
SCRUBBED_LOGGERS = (LOGGER_NAME, "httpx", "httpcore")
"""Loggers (and their children) whose records are masked: ours, and the HTTP stack's, which logs URLs."""


def _scrub(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:
        # A call whose arguments do not fit its format (another library's bug) is logging's to report
        # when the record is handled, as it would be without us; the record is left as it came.
        return
    cleaned = redact(message)
    if cleaned != message:
        record.msg = cleaned
        record.args = ()


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets in the formatted message."""

    def filter(self, record: logging.LogRecord) -> bool:
        _scrub(record)
        return True


def _install_record_factory() -> None:
    """Mask records of every :data:`SCRUBBED_LOGGERS` logger and its children (which a logger's filters would
    not see) when they are created, chaining to the factory installed before."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "_ddlscale_redacting", False):
        return

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if any(record.name == name or record.name.startswith(name + ".") for name in SCRUBBED_LOGGERS):
            _scrub(record)
        return record

    factory._ddlscale_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def install_redaction() -> None:
    """Mask secrets in the records of :data:`SCRUBBED_LOGGERS` from now on (idempotent): a filter on the
    package logger and a record factory chained to the process's current one."""
    with _lock:
        logger = logging.getLogger(LOGGER_NAME)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
        _install_record_factory()
