"""Errors raised by host discovery."""

from ringmaster.common.errors import UsageError


class DiscoveryError(UsageError):
    """Discovery could not produce a valid host set; the message says what and where.

    At job start this refuses to begin; later the last good host set is kept.
    """
