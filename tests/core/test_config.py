"""Settings files (core/config.py): typed sections, errors that name the field, TOML and JSON round trips."""
from __future__ import annotations

import dataclasses
import json
import tomllib

import pytest

from pipeloom.core.config import (ConfigError, JobSection, ModelSection, PartitionSection, PipeloomConfig,
                                  ScheduleSection, TrainingSection, TuneSection, read_config)

SECTIONS = (ScheduleSection, PartitionSection, ModelSection, TrainingSection, JobSection, TuneSection)


def _full() -> PipeloomConfig:
    """Every section with values that differ from the defaults, awkward strings included."""
    return PipeloomConfig(
        schedule=ScheduleSection(name="zbv", pp=4, vpp=2, microbatches=8, mem_limit="0.75p",
                                 costs="F=1,B=1.5,W=0.5,comm=0.1", mem="a=0.5,b=0.25", runtime="torch",
                                 options={"time_limit": 30, "placement": "v", "weights": [1, 2.5], "x y": True}),
        partition=PartitionSection(layers_per_chunk=(3, 2, 2, 1, 4, 4, 4, 4), model="llama2-7b", seq=4096),
        model=ModelSection(name='dir with "quotes"\\ and \u00e9\ttab', dim=128),
        training=TrainingSection(dp=2, steps=5, microbatch_size=1, seq_len=64, lr=3e-4, seed=7, dtype="bf16",
                                 zero=1, overlap_grad_reduce=True, rank_order="pp-dp", data="train.bin",
                                 data_dtype="uint32"),
        job=JobSection(verify=True, log_dir="logs", profile_steps="1:3", timeout_s=30.0),
        tune=TuneSection(model="llama2-70b", gpus=1024, gpu="h100", global_batch=1024, seq=4096, tp=8,
                         recompute="selective", step_time_s=12.5, mfu=0.41, tokens_per_s=335000.0),
    )


def test_toml_round_trip_every_field():
    cfg = _full()
    text = cfg.to_toml("written by a test\nsecond line")
    assert text.startswith("# written by a test\n# second line\n")
    assert PipeloomConfig.from_toml(text) == cfg
    # an independent reader agrees with the values (not only our own reader)
    data = tomllib.loads(text)
    assert data["schedule"]["options"] == {"time_limit": 30, "placement": "v", "weights": [1, 2.5], "x y": True}
    assert data["partition"]["layers_per_chunk"] == [3, 2, 2, 1, 4, 4, 4, 4]
    assert data["model"]["name"] == 'dir with "quotes"\\ and \u00e9\ttab'
    assert data["training"]["lr"] == 3e-4 and data["job"]["timeout_s"] == 30.0


def test_json_round_trip_and_files(tmp_path):
    cfg = _full()
    assert PipeloomConfig.from_json(cfg.to_json()) == cfg
    for name in ("s.toml", "s.json"):
        cfg.save(tmp_path / name)
        back, fields = read_config(tmp_path / name)
        assert back == cfg
        assert "schedule.pp" in fields and "training.zero" in fields and "schedule.costs" in fields
    assert json.loads((tmp_path / "s.json").read_text())["training"]["dp"] == 2


def test_defaults_round_trip_and_none_left_out():
    cfg = PipeloomConfig()
    assert PipeloomConfig.from_toml(cfg.to_toml()) == cfg
    assert "vpp" not in cfg.to_toml() and "null" not in cfg.to_json()


def test_fields_in_counts_only_what_the_file_sets(tmp_path):
    p = tmp_path / "a.toml"
    p.write_text('[schedule]\nname = "zbv"\npp = 2\n')
    cfg, fields = read_config(p)
    assert fields == {"schedule.name", "schedule.pp"}  # pp = 2 is the default, but the file set it
    assert cfg.schedule.microbatches == 4


def test_every_optional_field_defaults_to_none_and_has_a_docstring():
    """None is 'not set' and is left out when saving: an optional field with another default would not round-trip."""
    import inspect

    for cls in SECTIONS + (PipeloomConfig,):
        src = inspect.getsource(cls)
        for f in dataclasses.fields(cls):
            if "None" in str(f.type):
                assert f.default is None, f"{cls.__name__}.{f.name}"
            # one docstring per field: the line after the field is a string
            after = src.split(f"\n    {f.name}:", 1)[1].split("\n", 2)[1].strip()
            assert after.startswith('"""'), f"{cls.__name__}.{f.name} has no docstring"


@pytest.mark.parametrize("make, field", [
    (lambda: ScheduleSection(pp=0), "schedule.pp"),
    (lambda: ScheduleSection(mem_limit="-1p"), "schedule.mem_limit"),
    (lambda: ScheduleSection(costs="F=x"), "schedule.costs"),
    (lambda: ScheduleSection(runtime="jax"), "schedule.runtime"),
    (lambda: PartitionSection(layers_per_chunk=(2, 0)), "partition.layers_per_chunk"),
    (lambda: PartitionSection(layers=9, layers_per_chunk=(4, 4)), "partition.layers_per_chunk"),
    (lambda: PartitionSection(balance="fast"), "partition.balance"),
    (lambda: ModelSection(dim=12), "model.dim"),
    (lambda: TrainingSection(dtype="fp16"), "training.dtype"),
    (lambda: TrainingSection(zero=2), "training.zero"),
    (lambda: TrainingSection(lr=float("nan")), "training.lr"),
    (lambda: JobSection(timeout_s=0), "job.timeout_s"),
    (lambda: TuneSection(recompute="some"), "tune.recompute"),
])
def test_errors_name_the_field(make, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        make()


def test_file_errors_name_file_section_and_field(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[schedule]\nppp = 4\n')
    with pytest.raises(ConfigError, match=r"bad\.toml: schedule\.ppp is not a field; \[schedule\] has: name, pp"):
        read_config(p)
    p.write_text('[scheduel]\npp = 4\n')
    with pytest.raises(ConfigError, match="unknown section 'scheduel'; sections: schedule, partition"):
        read_config(p)
    p.write_text('[training]\ndp = "two"\n')
    with pytest.raises(ConfigError, match=r"bad\.toml: training\.dp must be an integer >= 1, got 'two'"):
        read_config(p)
    p.write_text('[training\n')
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_config(p)
    with pytest.raises(ConfigError, match=r"\.toml or \.json"):
        read_config(tmp_path / "x.yaml")


def test_non_finite_values_are_refused_when_saving():
    with pytest.raises(ConfigError, match="schedule.options.x"):
        PipeloomConfig(schedule=ScheduleSection(options={"x": float("inf")})).to_toml()


def test_a_new_field_is_checked_by_its_type_without_a_line_of_its_own():
    # one validation shape for every section: a field appended to a section (as the next feature will) is checked
    # from its declared type, with the same message as the others, before any line is written for it
    @dataclasses.dataclass(kw_only=True, slots=True)
    class Job2(JobSection):
        retries: int | None = None
        share: float = 0.5

    assert Job2(retries=3, share=0.25).retries == 3
    with pytest.raises(ConfigError, match=r"^job\.retries must be an integer >= 1 \(or left out\), got 0$"):
        Job2(retries=0)
    with pytest.raises(ConfigError, match=r"^job\.share must be a finite number > 0, got nan$"):
        Job2(share=float("nan"))


def test_a_field_of_a_type_without_a_rule_is_refused_when_made():
    @dataclasses.dataclass(kw_only=True, slots=True)
    class Job3(JobSection):
        hosts: list | None = None

    with pytest.raises(TypeError, match=r"job\.hosts: no check for a field of type list \| None"):
        Job3()
