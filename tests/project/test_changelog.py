"""CHANGELOG.md reads as a user's log in Keep a Changelog's form: one section per version, newest
first, each with its date, and Added / Changed / Deprecated / Removed / Fixed / Security at most
once each, one entry per change."""

from __future__ import annotations

import re

from harness import ROOT

KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
VERSION = re.compile(r"^## \[(Unreleased|\d+\.\d+\.\d+)\](?: - (\d{4}-\d{2}-\d{2}))?$")


def test_one_section_per_version_newest_first_each_kind_once() -> None:
    versions: list[tuple[str, str | None]] = []
    kinds: dict[str, list[str]] = {}
    for line in (ROOT / "CHANGELOG.md").read_text().splitlines():
        if line.startswith("## "):
            found = VERSION.match(line)
            assert found, f"not a version heading: {line!r}"
            versions.append((found[1], found[2]))
            kinds[found[1]] = []
        elif line.startswith("### "):
            assert versions, f"{line!r} before any version"
            kind = line[4:].strip()
            assert kind in KINDS, f"{line!r}: a section is one of {KINDS}, named plainly"
            kinds[versions[-1][0]].append(kind)
    names = [name for name, _ in versions]
    assert names[0] == "Unreleased" and names.count("Unreleased") == 1
    released = [tuple(int(part) for part in name.split(".")) for name in names[1:]]
    assert released == sorted(released, reverse=True) and len(set(released)) == len(released), names
    assert all(date for name, date in versions[1:] if name != "0.1.0"), "a release has its date"
    for name, sections in kinds.items():
        assert len(sections) == len(set(sections)), f"{name}: {sections} (each kind once)"
        assert sections == sorted(sections, key=KINDS.index), f"{name}: {sections} (in Keep a Changelog's order)"
