"""Reading a topics file once for both its data and where each key sits."""

from __future__ import annotations

import pytest
import yaml

from cairn import yaml_lines

TEXT = """\
defaults: &base
  format: json
  max_delay: 90s
topics:
  - topic: orders
    <<: *base
    event_time: {field: ts, encoding: iso8601}
  - topic: "payments"
    format: avro
"""


def test_the_data_is_what_safe_load_gives_and_the_nodes_say_where_each_key_is() -> None:
    data, root = yaml_lines.parse(TEXT)
    assert data == yaml.safe_load(TEXT)
    assert data["topics"][0]["max_delay"] == "90s"  # the merge key and alias resolved
    assert yaml_lines.line(yaml_lines.child(root, "defaults"), "max_delay") == 3
    first = yaml_lines.child(yaml_lines.child(root, "topics"), 0)
    assert yaml_lines.line(first, "event_time.encoding") == 7


def test_an_empty_document_has_no_data_and_no_nodes() -> None:
    assert yaml_lines.parse("") == (None, None)
    assert yaml_lines.parse("# only a comment\n") == (None, None)


def test_a_broken_document_fails_with_the_line_of_its_mistake() -> None:
    with pytest.raises(yaml.YAMLError) as err:
        yaml_lines.parse("topics:\n  - topic: a\n   format: json\n")
    assert yaml_lines.error_line(err.value)[0] == 3
    with pytest.raises(yaml.YAMLError, match="expected a single document"):
        yaml_lines.parse("a: 1\n---\nb: 2\n")
