"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class KvbenchError(Exception):
    """Bad input or an impossible request, explained in one line for the user."""

    exit_code = 2


class RunFailed(KvbenchError):
    """The command ran, but what it measured failed (every point, or some with --continue-on-error).

    Exit code 1, like a regression: the input was fine, the result is not.
    """

    exit_code = 1
