"""Stored protocol objects say their format: files written before the field existed still read
as format 1, this code writes the version it reads, and a newer one is refused loudly, never
misread or taken for absent.

`tests/fixtures/format-1/` holds tokens, claims and manifests of one archive, one rebuild and one
seal as the release before format versions wrote them (copied from a randomized fault run's
archive root); they must stay readable for as long as archives written then exist."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import pytest

from cairn.pipeline import archive_run, rebuild, seal
from cairn.protocol import commit, manifest, tokens
from cairn.protocol.format_version import FORMAT_VERSION, NewerFormat
from cairn.storage.objects import Storage

RELEASE = Path(__file__).parents[1] / "fixtures" / "format-1"
TOPIC = "it.events-411d89fc"


@pytest.fixture
def release(tmp_path) -> Storage:
    """An archive root holding the release's files (a copy: tests may write)."""
    shutil.copytree(RELEASE, tmp_path / "root")
    return Storage((tmp_path / "root").as_uri())


def test_the_releases_tokens_claims_and_manifests_read_as_format_1(release) -> None:
    archived, rebuilt, sealed = (tokens.token_at(release, TOPIC, seq) for seq in (1, 7, 8))

    assert [t.format_version for t in (archived, rebuilt, sealed)] == [1, 1, 1]
    assert (archived.kind, archived.next_offsets, archived.counts.read) == (
        "archive",
        {0: 9, 1: 0, 2: 0},
        8,
    )
    assert rebuilt.rebuilt is not None and rebuilt.rebuilt.dates == [
        date(2024, 5, 2),
        date(2024, 5, 3),
    ]
    assert sealed.sealed is not None and (
        sealed.sealed.files_before,
        sealed.sealed.files_after,
    ) == (
        12,
        4,
    )
    load = {"archive": manifest.load, "rebuild": rebuild.load_attempt, "seal": seal.load_attempt}
    for token in (archived, rebuilt, sealed):
        claim = commit.load_claim(release, TOPIC, token.attempt_id)
        assert claim is not None and claim.format_version == 1 and claim.seq == token.seq
        found = load[token.kind](release, token.manifest)
        assert found.format_version == 1 and found.attempt_id == token.attempt_id

    # each kind's whole claim object, the plan its later steps read by reference
    planned = archive_run.load_claimed(
        release, commit.load_claim(release, TOPIC, archived.attempt_id).key
    )
    assert planned.plan.ranges == {0: (0, 9), 1: (0, 0), 2: (0, 0)}
    chosen = seal.load_claimed(release, commit.load_claim(release, TOPIC, sealed.attempt_id).key)
    assert chosen.date == date(2024, 5, 3) and chosen.table is not None
    picked = rebuild.load_claimed(
        release, commit.load_claim(release, TOPIC, rebuilt.attempt_id).key
    )
    assert len(picked.sources) == len(rebuilt.rebuilt.sources)


def test_what_this_code_writes_carries_the_version_it_reads(release) -> None:
    token = tokens.token_at(release, TOPIC, 1)

    written = json.loads(token.model_dump_json())

    assert written["format_version"] == FORMAT_VERSION
    assert tokens.Token.model_validate(written) == token


@pytest.mark.parametrize(
    "key",
    [
        f"_tokens/{TOPIC}/000000000008.json",
        f"_claims/{TOPIC}/seal/000000000008-000001.json",
        f"_manifests/{TOPIC}/s-000000000008-000001-bafb9e.json",
    ],
)
def test_a_newer_format_is_refused_naming_the_file_never_taken_for_absent(release, key) -> None:
    body = json.loads(release.read(key))
    (body["claim"] if "_claims/" in key else body)["format_version"] = FORMAT_VERSION + 1
    release.write(key, json.dumps(body).encode())

    with pytest.raises(NewerFormat, match=f"{key}: .* format {FORMAT_VERSION + 1} .*newer Cairn"):
        if key.startswith("_tokens/"):
            tokens.token_at(release, TOPIC, 8)
        elif key.startswith("_claims/"):
            commit.load_claim(release, TOPIC, "s-000000000008-000001-bafb9e")
        else:
            seal.load_attempt(release, key)
