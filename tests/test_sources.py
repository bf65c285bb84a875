"""Citations stay inside the repository: docs/sources.md lists the original sources, and
every figure a profile declares names one of them."""

import pathlib
import re

from ssdemu.sim.profile import available, load


def test_every_profile_figure_names_a_source_listed_in_the_repository():
    """Issue 31: a calibration figure's source names its original by a tag of
    docs/sources.md (or says why it is assumed); nothing points outside the repository."""
    root = pathlib.Path(__file__).resolve().parent.parent
    sources = (root / "docs" / "sources.md").read_text()
    listed = set(re.findall(r"^\| \[([\w-]+)\] \|", sources, re.M))
    assert {"STAR2000D", "PM1743", "NVMeVirt", "PM9A3", "P4500"} <= listed
    for name in available():
        text = (root / "ssdemu" / "sim" / "profiles" / f"{name}.yaml").read_text()
        assert "REFERENCE.md" not in text and "shared/" not in text, name
        for fig in load(name).calibration:
            if fig.assumed:
                continue
            tags = set(re.findall(r"\[([\w-]+)\]", fig.source))
            assert tags and tags <= listed, (name, fig.name, fig.source)
