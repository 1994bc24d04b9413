"""Schedule files, one module per format (no torch).

    native     pipeloom's own JSON and CSV (``pipeloom plan --out``; the job-log meta line)
    torch_csv  torch.distributed.pipelining's schedule CSV (``_PipelineScheduleRuntime._load_csv``), both ways
               (imported when a torch file is read or written)
    official   the official zero-bubble generators' job lists (../shared/reference), read-only
    files      load / save any of them, told apart by name and content
"""
from .files import FORMATS, load, parse, save
from .native import from_csv, from_dict, from_json, to_csv, to_dict, to_json

__all__ = ["FORMATS", "from_csv", "from_dict", "from_json", "load", "parse", "save", "to_csv", "to_dict", "to_json"]
