"""Every app of the shared corpora parses, validates and survives rendering unchanged."""

from __future__ import annotations

import pytest
from siddhi_corpus import CONFORMANCE_FILES, TOPOLOGY_FILE, conformance_cases, corpus_apps, needs_shared, topology_cases

from sp_dagster.siddhi import parse
from sp_dagster.siddhi.render import render
from sp_dagster.siddhi.validate import validate

pytestmark = needs_shared


def test_the_corpora_are_all_loaded():
    lines = sum(len([x for x in p.read_text().splitlines() if x.strip()]) for p in CONFORMANCE_FILES)
    assert lines > 0 and len(conformance_cases()) == lines
    assert len(topology_cases()) == len([x for x in TOPOLOGY_FILE.read_text().splitlines() if x.strip()])
    assert all("@dist" in case["app"] for case in topology_cases())


@pytest.mark.parametrize("text", corpus_apps())
def test_app_parses_validates_and_round_trips(text):
    app = parse(text)
    assert app.elements, "an app of the corpus has at least one element"
    assert validate(app) == []
    rendered = render(app)
    again = parse(rendered)
    assert again == app
    assert hash(again) == hash(app)
    assert render(again) == rendered, "rendering is canonical: the same tree always gives the same text"
