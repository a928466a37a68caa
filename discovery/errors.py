"""Errors raised by host discovery."""


class DiscoveryError(Exception):
    """Discovery could not produce a valid host set; the message says what and where.

    At job start this refuses to begin; later the last good host set is kept.
    """
