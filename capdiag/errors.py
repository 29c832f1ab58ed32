"""The one error type the CLI turns into a one-line message and exit code 2."""


class InputError(Exception):
    """Input that cannot be analysed: missing, binary, empty, unrecognised or malformed."""
