"""The config reference lists every key of the model, and docs/configuration.md and the topics
file's header hold it as `python -m cairn config-reference` prints it, so the docs cannot drift."""

from __future__ import annotations

from cairn.cli import main
from cairn.config import REPO, TopicConfig
from cairn.formats import FORMATS
from cairn.formats.avro import AvroSettings
from cairn.formats.base import EventTime
from cairn.views.config_reference import reference


def listed() -> set[str]:
    """The keys the reference names, each at the start of a line."""
    return {line.split()[0] for line in reference().splitlines() if line[:1].islower()}


def test_every_key_of_the_model_is_listed_with_a_description() -> None:
    keys = {info.alias or name for name, info in TopicConfig.model_fields.items()}
    keys = keys - {"format_settings"} | {f for f in FORMATS if FORMATS[f].Settings is not None}
    keys |= {f"event_time.{name}" for name in EventTime.model_fields}
    keys |= {f"avro.{name}" for name in AvroSettings.model_fields}
    assert keys <= listed()
    for model in (TopicConfig, EventTime, AvroSettings):
        assert all(info.description for info in model.model_fields.values()), model
    for key in ("max_time_lag", "max_quarantine_ratio", "max_run_duration", "consumer_group"):
        assert key in listed()


def test_defaults_and_types_are_shown() -> None:
    lines = reference().splitlines()
    assert "max_time_lag                duration [1h]" in lines
    assert "codec                       deflate | snappy | zstandard | null [deflate]" in lines
    assert "archive_root                text [file://<repo>/.cairn/archive]" in lines
    assert "format                      text required" in lines


def test_the_cli_prints_it(capsys) -> None:
    assert main(["config-reference"]) == 0
    assert capsys.readouterr().out == reference()


def test_the_configuration_guide_and_the_topics_file_header_hold_it_as_printed() -> None:
    guide = (REPO / "docs" / "configuration.md").read_text()
    assert f"```text\n{reference()}```" in guide
    header = (REPO / "include" / "topics.yaml").read_text().split("\ndefaults:")[0]
    commented = "".join(f"# {line}".rstrip() + "\n" for line in reference().splitlines())
    assert commented in header + "\n"
