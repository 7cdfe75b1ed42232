"""The two kinds of error a user can cause, each printed by the CLI as one line.

UsageError: the request is wrong (an empty prompt, -n 0, a negative temperature); exit status 2.
ModelError: the model files are wrong (missing, truncated, a header that lies); exit status 1.
Messages name what is wrong and where: the file, the tensor, the flag.
"""


class TinydiffError(Exception):
    exit_status = 1


class UsageError(TinydiffError, ValueError):
    exit_status = 2


class ModelError(TinydiffError):
    exit_status = 1
