"""The error of every driver-side input check (paths, data files and rows, trackers): the command line prints
its message as one `error:` line and exits with 2, before Ray starts."""


class InputError(ValueError):
    """A configured path, file or entry that cannot be used; the message names the config key."""
