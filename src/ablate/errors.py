"""The one exception type that the CLI shows as a single line (no traceback wall)."""


class AblateError(Exception):
    """Bad input or environment: the message names what is wrong and where."""
