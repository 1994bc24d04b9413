"""Schedule files, one module per format (no torch).

    native    pipeloom's own JSON and CSV (``pipeloom plan --out``; the job-log meta line)
    official  the official zero-bubble generators' job lists (../shared/reference), read-only

:func:`load` and :func:`save` pick the format from the file name.
"""
from .native import from_csv, from_dict, from_json, load, save, to_csv, to_dict, to_json

__all__ = ["from_csv", "from_dict", "from_json", "load", "save", "to_csv", "to_dict", "to_json"]
