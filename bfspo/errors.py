"""The one exception type that the command line turns into a clear message and a non-zero exit."""


class BfspoError(Exception):
    """A problem with the user's input (data, config, paths) rather than a bug in bfspo."""
