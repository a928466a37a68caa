"""The documentation site stays true: it builds strictly (a broken link, anchor or page left out
of the navigation fails the build), its reference names every flag of every verb and every
public name of the Python API, every flag is written on a page a user reads too, and README.md stays a page one reads in
five minutes."""

from __future__ import annotations

import argparse
import html
import importlib.util
import os
import re
import subprocess
import sys
import types

import pytest
from harness import ROOT

README_MOST_LINES = 250


def _hook() -> types.ModuleType:
    """docs/hooks/reference.py, which generates the reference's tables (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory):
    built = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(built)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return built


def _page(site, *path: str) -> str:
    return html.unescape((site.joinpath(*path) / "index.html").read_text())


def _section(page: str, code: str) -> str:
    """The HTML of the `## `code`` section of a page, up to the next heading of that level."""
    found = re.search(r'<h2 id="[^"]*"><code>' + re.escape(code) + "</code>", page)
    assert found is not None, f"no section for {code!r}"
    end = page.find("<h2 id=", found.end())
    return page[found.start():end if end != -1 else len(page)]


@pytest.mark.slow  # (builds the whole site: seconds, not for `pytest -q`)
def test_the_site_builds_strictly_and_names_every_flag_of_every_verb(site) -> None:
    cli = _page(site, "reference", "cli")
    missing = []
    for verb, parser in _hook()._verbs():
        section = _section(cli, verb)
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            missing += [f"{verb} {flag}" for flag in action.option_strings if f"<code>{flag}" not in section]
    assert not missing, f"flags missing from docs/reference/cli.md's generated tables: {missing}"
    assert "<code>ringmaster run</code>" in cli and "<code>ringmaster pool serve</code>" in cli


def test_every_flag_of_every_verb_is_on_a_page_a_user_reads() -> None:
    """Not only in the generated table (reference/cli.md): each flag is spelled out, as the
    command line takes it, in a guide, a cluster or operations page, the run-flags page or README."""
    pages = [path.read_text() for path in (ROOT / "docs").rglob("*.md") if path.name != "cli.md"]
    pages.append((ROOT / "README.md").read_text())
    missing = []
    for verb, parser in _hook()._verbs():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction,
                                                                       argparse._SubParsersAction)):
                continue
            spelled = [re.compile(re.escape(flag) + r"(?![\w-])") for flag in action.option_strings]
            missing += [f"{verb} {flag}" for flag, pattern in zip(action.option_strings, spelled)
                        if not any(pattern.search(page) for page in pages)]
    assert not missing, f"flags written on no page but the generated reference: {missing}"


@pytest.mark.slow  # (builds the whole site: seconds, not for `pytest -q`)
def test_every_public_name_of_the_python_api_has_its_entry(site) -> None:
    api = _page(site, "reference", "python-api")
    hook = _hook()
    missing = [f"{m}.{name}" for m in hook.PUBLIC_MODULES for name in importlib.import_module(m).__all__
               if f'id="{m}.{name}"' not in api]
    assert not missing, missing
    # __all__ is the public API: every public attribute of ringmaster.torch that is not a module is in it.
    import ringmaster.torch as hvd

    outside = [name for name, value in vars(hvd).items() if not name.startswith("_") and name != "annotations"
               and not isinstance(value, types.ModuleType) and name not in hvd.__all__]
    assert not outside, (
        f"public names of ringmaster.torch missing from its __all__ (and so from the reference): {outside}"
    )


@pytest.mark.slow  # (builds the whole site: seconds, not for `pytest -q`)
def test_the_control_apis_and_settings_are_in_the_reference(site) -> None:
    from ringmaster.settings import AgentSettings, JobSettings

    apis = _page(site, "reference", "control-api")
    assert "GET /status" in apis and "POST /scale" in apis and "POST /jobs" in apis
    settings = _page(site, "reference", "settings")
    assert not [f for model in (JobSettings,
                                AgentSettings) for f in model.model_fields if f"<code>{f}</code>" not in settings]
    from ringmaster.common.events import Kind

    events = _page(site, "reference", "events")
    assert not [k.value for k in Kind if f"<code>{k.value}</code>" not in events]


def test_readme_is_short_and_links_into_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MOST_LINES, f"README.md has grown past {README_MOST_LINES} lines"
    linked = {part.split(")", 1)[0] for part in readme.split("](")[1:]}
    missing = [link for link in linked if not link.startswith("http") and not (ROOT / link.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_two_builds_laying_out_the_package_at_once_never_leave_a_link_missing(tmp_path) -> None:
    """Two docs builds at once (the docs tests on two pytest workers) each lay the package out
    while the other reads it: a layout that was removed and remade failed the other build with
    `No such file or directory: 'proto'` in a full run of the project tests."""
    import threading

    lay_out = _hook().lay_out_package
    into = tmp_path / "layout"
    lay_out(into=into)
    expected = sorted(entry.name for entry in (into / "ringmaster").iterdir())
    missing: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            present = {entry.name for entry in (into / "ringmaster").iterdir() if not entry.name.startswith(".")}
            missing.extend(sorted(set(expected) - present))
            if not (into / "ringmaster" / "torch" / "__init__.py").exists():
                missing.append("torch/__init__.py")

    def write() -> None:
        for _ in range(40):
            lay_out(into=into)

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write) for _ in range(3)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
    stop.set()
    reader.join(timeout=10)
    assert not missing, f"a build reading the layout found these missing: {sorted(set(missing))}"
    assert sorted(entry.name for entry in (into / "ringmaster").iterdir()) == expected
    assert (into / "ringmaster" / "torch").resolve() == ROOT / "worker" / "torch"
