"""Settings files: the schedule, partition, run and tune settings as nested, typed sections that load from and
save to TOML or JSON (no torch).

One file, ``pipeloom.toml`` (``pipeloom tune --out DIR`` writes one), read by ``pipeloom plan --config FILE``
and ``pipeloom run --config FILE``; a flag given on the command line wins over the file. The sections, in
torchtitan's style (keyword-only dataclasses, one docstring per field, checked when made; they live in
:mod:`pipeloom.core.sections`, with the one check of their fields)::

    [schedule]    what to plan: builder, pp, vpp, microbatches, memory limit, costs, builder options
    [partition]   how the model's layers are cut into the pp*vpp chunks
    [model]       what `pipeloom run` trains
    [training]    data parallelism, steps, batch, optimizer, dtype
    [job]         checking, logs and timeouts of a run
    [tune]        what `pipeloom tune` was asked and what it predicted for this plan (a record)

A field left out of the file is the field's default; ``None`` means "not set" (the command's own default
applies) and is left out when saving, since TOML has no null. An error names the field as
``section.field`` and says what is allowed::

    >>> cfg = PipeloomConfig(schedule=ScheduleSection(name="zbv", pp=4, microbatches=8, mem_limit="1p"))
    >>> PipeloomConfig.from_toml(cfg.to_toml()) == cfg
    True
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field

from .sections import (ConfigError, JobSection, ModelSection, PartitionSection, ScheduleSection, TrainingSection,
                       TuneSection)

#: the file ``pipeloom tune --out DIR`` writes into DIR
CONFIG_NAME = "pipeloom.toml"


_SECTIONS = {"schedule": ScheduleSection, "partition": PartitionSection, "model": ModelSection,
             "training": TrainingSection, "job": JobSection, "tune": TuneSection}


@dataclass(kw_only=True, slots=True)
class PipeloomConfig:
    """A whole settings file: one typed section each."""

    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    """what to plan"""
    partition: PartitionSection = field(default_factory=PartitionSection)
    """how the layers are cut into chunks"""
    model: ModelSection = field(default_factory=ModelSection)
    """what a run trains"""
    training: TrainingSection = field(default_factory=TrainingSection)
    """data parallelism, steps, batch, optimizer, dtype"""
    job: JobSection = field(default_factory=JobSection)
    """checking, logs and timeouts"""
    tune: TuneSection = field(default_factory=TuneSection)
    """the tuner's record"""

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"{name} must be a {cls.__name__}, got {type(getattr(self, name)).__name__}")

    # ------------------------------------------------------------------ dicts
    def to_dict(self) -> dict:
        """Nested plain values: ``{section: {field: value}}``, None fields and empty sections left out."""
        out = {}
        for name in _SECTIONS:
            sec = getattr(self, name)
            d = {}
            for f in dataclasses.fields(sec):
                v = getattr(sec, f.name)
                if v is None or (isinstance(v, dict) and not v):
                    continue
                d[f.name] = list(v) if isinstance(v, tuple) else v
            if d:
                out[name] = d
        return out

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "config") -> "PipeloomConfig":
        """The config of nested plain values (as :meth:`to_dict` makes); unknown sections or fields are
        errors naming them and listing the allowed ones."""
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a table of sections ({', '.join(_SECTIONS)}), got "
                              f"{type(data).__name__}")
        unknown = [k for k in data if k not in _SECTIONS]
        if unknown:
            raise ConfigError(f"{where}: unknown section {unknown[0]!r}; sections: {', '.join(_SECTIONS)}")
        kw = {}
        for name, sec_cls in _SECTIONS.items():
            d = data.get(name, {})
            if not isinstance(d, dict):
                raise ConfigError(f"{where}: [{name}] must be a table of fields, got {d!r}")
            names = [f.name for f in dataclasses.fields(sec_cls)]
            bad = [k for k in d if k not in names]
            if bad:
                raise ConfigError(f"{where}: {name}.{bad[0]} is not a field; [{name}] has: {', '.join(names)}")
            vals = {}
            for k, v in d.items():
                hint = _HINTS[name][k]
                if isinstance(v, list) and "tuple" in hint:
                    v = tuple(v)
                if isinstance(v, int) and not isinstance(v, bool) and "float" in hint and "int" not in hint:
                    v = float(v)
                vals[k] = v
            try:
                kw[name] = sec_cls(**vals)
            except ConfigError as e:
                raise ConfigError(f"{where}: {e}") from None
        return cls(**kw)

    @staticmethod
    def fields_in(data: dict) -> frozenset[str]:
        """``section.field`` of every field a file's nested values set (what a command line may override)."""
        return frozenset(f"{s}.{k}" for s, d in data.items() if isinstance(d, dict) for k in d)

    # ------------------------------------------------------------------ files
    def to_json(self) -> str:
        """Strict JSON text (no NaN/Infinity)."""
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str, *, where: str = "config") -> "PipeloomConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(data, where=where)

    def to_toml(self, header: str = "") -> str:
        """TOML text: one ``[section]`` table each (``header``: comment lines put first)."""
        lines = [f"# {h}" if h else "#" for h in header.splitlines()] if header else []
        for name, d in self.to_dict().items():
            if lines:
                lines.append("")
            lines.append(f"[{name}]")
            for k, v in d.items():
                lines.append(f"{k} = {_toml_value(v, f'{name}.{k}')}")
        return "\n".join(lines) + "\n"

    @classmethod
    def from_toml(cls, text: str, *, where: str = "config") -> "PipeloomConfig":
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{where}: not valid TOML ({e})") from None
        return cls.from_dict(data, where=where)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PipeloomConfig":
        """Read a .toml or .json settings file; every error names the file."""
        return read_config(path)[0]

    def save(self, path: str | os.PathLike, header: str = "") -> None:
        """Write .toml or .json (by the name) whole or not at all."""
        from .files import write_text

        path = os.fspath(path)
        if path.lower().endswith(".json"):
            write_text(path, self.to_json())
        elif path.lower().endswith(".toml"):
            write_text(path, self.to_toml(header))
        else:
            raise ConfigError(f"{path}: a settings file ends in .toml or .json")


def read_config(path: str | os.PathLike) -> tuple[PipeloomConfig, frozenset[str]]:
    """A .toml or .json settings file and the ``section.field`` names it sets; every error names the file."""
    path = os.fspath(path)
    if not path.lower().endswith((".toml", ".json")):
        raise ConfigError(f"{path}: a settings file ends in .toml or .json")
    from .files import InputFileError, parse_json, read_input

    try:  # bounded, regular files only, every error naming the file (core/files.py)
        text = read_input(path, "settings file")
        if path.lower().endswith(".json"):
            data = parse_json(text, path)
    except InputFileError as e:
        raise ConfigError(f"{e} (expected TOML or JSON settings)" if "not a text file" in str(e) else str(e)) from None
    if not path.lower().endswith(".json"):
        import tomllib

        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML ({e})") from None
        except RecursionError:
            raise ConfigError(f"{path}: nested too deeply to be a settings file") from None
    cfg = PipeloomConfig.from_dict(data, where=path)
    if cfg.schedule.plan is not None and not os.path.isabs(cfg.schedule.plan):  # relative to the settings file
        cfg.schedule.plan = os.path.join(os.path.dirname(path), cfg.schedule.plan)
    return cfg, PipeloomConfig.fields_in(data)


_HINTS = {name: {f.name: str(f.type) for f in dataclasses.fields(cls)} for name, cls in _SECTIONS.items()}


def _toml_value(v, where: str) -> str:
    """A TOML value: bool, int, finite float, string (basic, escaped), array, inline table."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ConfigError(f"{where} = {v}: not a finite number (TOML and strict JSON have none)")
        return repr(v)
    if isinstance(v, str):
        # JSON's escapes are TOML's (\" \\ \b \f \n \r \t \uXXXX); DEL must be escaped in TOML too
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x, where) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x, f'{where}.{k}')}" for k, x in v.items()) + "}"
    if v is None:
        raise ConfigError(f"{where}: TOML has no null (leave the field out)")
    raise ConfigError(f"{where} = {v!r}: cannot write a {type(v).__name__} to TOML")


def _toml_key(k: str) -> str:
    import re

    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(str(k), "key")


__all__ = ["PipeloomConfig", "ScheduleSection", "PartitionSection", "ModelSection", "TrainingSection", "JobSection",
           "TuneSection", "ConfigError", "CONFIG_NAME", "read_config"]
