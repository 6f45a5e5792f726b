"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class KvbenchError(Exception):
    """Bad input or an impossible request, explained in one line for the user."""

    exit_code = 2
