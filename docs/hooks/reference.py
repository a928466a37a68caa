"""mkdocs hook: the reference pages' tables, generated from the code at every build.

A page says `<!-- reference: NAME -->` where a table goes; this hook puts it there from the
thing itself, so the reference cannot drift from the code: `cli` (every verb of the `ringmaster`
command and every flag, from the argument parsers), `control-api` and `pool-api` (every path of
the job's and the pool's HTTP APIs, from their OpenAPI schemas), `settings` (every field of
`JobSettings` and `AgentSettings`, with its default and bounds), `readme` (README.md as the
site's home, its links made the site's), `events` (every event kind, its level and wording), `python-api` (every name in
`__all__` of `ringmaster.torch`, `ringmaster.torch.elastic` and `ringmaster.ray`, rendered by
mkdocstrings from the docstrings). `tests/project/test_docs.py`
builds the site strictly and checks every flag and every public name of `ringmaster.torch` is
in it.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import pathlib
import re
import shutil
import tomllib
import uuid
from typing import Any, Callable

_MARKER = re.compile(r"<!-- reference: ([a-z-]+) -->")


#: Characters of a help text that Markdown would read as markup (`[a][b]` is a reference link, an
#: `<x>` a tag, `*x*` emphasis): escaped, so a cell shows the text as written.
_MARKUP = re.compile(r"([\\[\]<>*|])")


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell: shown as written, markup characters escaped
    outside its code spans (inside them Markdown reads nothing but the cell's end, `|`)."""
    parts = re.split(r"(`[^`]*`)", str(text).replace("\n", " "))
    return "".join(_code_cell(part) if part.startswith("`") and part.endswith("`") and len(part) > 1
                   else _MARKUP.sub(r"\\\1", part) for part in parts).strip()


def _code_cell(text: object) -> str:
    """Text for a code span inside a table cell (markup is not read there: only `|` ends the cell)."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


# --------------------------------------------------------------------------- the CLI
def _verbs() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every verb's parser, nested ones (`pool serve`) included, `agent`'s own parser too."""
    from ringmaster.cli.main import build_parser
    from ringmaster.worker.agent.command import build_parser as agent_parser

    found: list[tuple[str, argparse.ArgumentParser]] = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if f"{prefix} {name}" == "ringmaster agent":
                        sub = agent_parser()
                    found.append((f"{prefix} {name}", sub))
                    walk(sub, f"{prefix} {name}")

    walk(build_parser(), "ringmaster")
    return found


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        if action.option_strings and action.nargs != 0:
            metavar = action.metavar or action.dest.upper()
            names += f" `{' '.join(metavar) if isinstance(metavar, tuple) else metavar}`"
        helped = (
            (action.help or "") % {"default": action.default} if "%(default)" in (action.help or "") else action.help
        )
        rows.append(f"| {names} | {_cell(helped or '')} |")
    return rows


def cli_reference() -> str:
    parts = []
    for verb, parser in _verbs():
        parts.append(f"## `{verb}`\n")
        about = parser.description or ""
        if about:
            parts.append(about.strip() + "\n")
        rows = _flag_rows(parser)
        if rows:
            parts.append("| flag | what it does |\n| --- | --- |\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------- the HTTP APIs
class _Nothing:
    """Stands for the running job or pool: only the routes are read, never served."""

    def __getattr__(self, name: str) -> "_Nothing":
        return _Nothing()  # (its parts too: `pool.pool_hosts.board`)


def _api_table(schema: dict[str, Any]) -> str:
    rows = []
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            said = operation.get("description") or operation.get("summary") or ""
            rows.append(f"| `{method.upper()} {path}` | {_cell(said.split(chr(10) + chr(10))[0])} |")
    return "| call | what it does |\n| --- | --- |\n" + "\n".join(rows) + "\n"


def control_api_reference() -> str:
    from ringmaster.rendezvous.server.http_api import create_app

    return _api_table(create_app(view=lambda **_: None, scale_to=lambda _n: None).openapi())


def pool_api_reference() -> str:
    from ringmaster.rendezvous.pool.api import create_pool_app

    return _api_table(create_pool_app(_Nothing(), "documentation").openapi())  # type: ignore[arg-type]


# --------------------------------------------------------------------------- settings
def settings_reference() -> str:
    from ringmaster.settings import AgentSettings, JobSettings

    parts = []
    for model in (JobSettings, AgentSettings):
        parts.append(f"## `{model.__name__}`\n\n{(model.__doc__ or '').strip()}\n")
        rows = []
        for name, field in model.model_fields.items():
            bounds = ", ".join(str(m) for m in field.metadata)
            default = "(required)" if field.is_required() else repr(field.get_default(call_default_factory=True))
            rows.append(f"| `{name}` | {_cell(default)} | {_cell(bounds)} | {_cell(field.description or '')} |")
        parts.append("| field | default | bounds | what it is |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n")
    return "\n".join(parts)


# --------------------------------------------------------------------------- the Python API
#: The public modules, each documented by its `__all__`.
PUBLIC_MODULES = ("ringmaster.torch", "ringmaster.torch.elastic", "ringmaster.ray")
ROOT = pathlib.Path(__file__).resolve().parents[2]
#: Where the installed package's layout is laid out as links, for griffe (mkdocs.yml's `paths`).
API_LAYOUT = ROOT / "build" / "api-layout"


def lay_out_package(root: pathlib.Path = ROOT, into: pathlib.Path = API_LAYOUT) -> None:
    """Links under `into` that give the package the layout it has once installed, from
    pyproject's package-dir (`ringmaster.torch` is worker/torch): griffe reads the source
    statically and finds a package only where its folders are.

    Brought up to date in place, never removed and remade: two builds at once (the docs tests
    on two pytest workers) each read the layout while the other lays it out, so no link the
    layout needs may be missing at any moment (each is replaced atomically)."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    wanted: dict[pathlib.Path, pathlib.Path] = {}
    for package, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        target = into.joinpath(*package.split("."))
        if package.count(".") == 0:
            if target.is_symlink():
                target.unlink(missing_ok=True)
            target.mkdir(parents=True, exist_ok=True)
            for entry in (root / folder).iterdir():
                if entry.name != "__pycache__":
                    wanted[target / entry.name] = entry
        else:
            wanted[target] = root / folder
    for link, source in wanted.items():
        _link_atomically(link, source)
    for folder in {link.parent for link in wanted}:
        for entry in folder.iterdir():
            if entry not in wanted and entry.is_symlink() and not entry.name.startswith("."):
                entry.unlink(missing_ok=True)  # a module since removed from the source


def _link_atomically(link: pathlib.Path, source: pathlib.Path) -> None:
    """`link` -> `source`, replacing whatever link was there in one rename."""
    if link.is_symlink() and os.readlink(link) == str(source):
        return
    if link.exists() and not link.is_symlink():
        shutil.rmtree(link)  # a folder left by an older layout
    spare = link.with_name(f".{link.name}.{uuid.uuid4().hex}")
    spare.symlink_to(source)
    os.replace(spare, link)


def python_api_reference() -> str:
    """mkdocstrings' directives for each public module, its members named by its `__all__`.
    Read from the source, not imported: the docs build needs neither torch nor Ray."""
    parts = []
    for module_name in PUBLIC_MODULES:
        summary, names = _module_summary_and_all(module_name)
        parts.append(f"## `{module_name}`\n\n{summary}\n\n::: {module_name}\n    options:\n"
                     f"      members: {names!r}\n")
    return "\n".join(parts)


def _module_summary_and_all(module_name: str) -> tuple[str, list[str]]:
    """A package's first docstring paragraph and its `__all__` (a literal list), from its source."""
    tree = ast.parse((_source_folder(module_name) / "__init__.py").read_text())
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            names = list(ast.literal_eval(node.value))
    return inspect.cleandoc(ast.get_docstring(tree) or "").split("\n\n")[0], names


def _source_folder(package: str) -> pathlib.Path:
    """Where a package of the namespace lives in the checkout (pyproject's package-dir, the
    longest mapping that holds it)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    holder = max((name for name in mapping if package == name or package.startswith(name + ".")), key=len)
    rest = package[len(holder):].strip(".")
    return ROOT / mapping[holder] / rest.replace(".", "/") if rest else ROOT / mapping[holder]


# --------------------------------------------------------------------------- events
def events_reference() -> str:
    """Every event kind with its level and console wording (the fields in braces), from
    `ringmaster.common.events.SPECS`."""
    import logging

    from ringmaster.common.events import SPECS, Kind

    rows = ["| kind | level | what it says (fields in braces) |", "| --- | --- | --- |"]
    for kind in Kind:
        spec = SPECS[kind]
        # (code: attr_list would take a closing {field} for attributes)
        rows.append(f"| `{kind.value}` | {logging.getLevelName(spec.level)} | `` {_code_cell(spec.text)} `` |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- the home page
def home_page() -> str:
    """README.md as the site's home (one text, not two that drift apart): its links into docs/
    made relative to the site, the changelog (outside the site) named instead of linked."""
    text = (ROOT / "README.md").read_text()
    text = text.replace("](docs/", "](")
    return re.sub(r"\[([^\]]+)\]\(CHANGELOG\.md\)", r"\1 (`CHANGELOG.md`)", text)


_MAKERS: dict[str, Callable[[], str]] = {
    "readme": home_page,
    "events": events_reference,
    "python-api": python_api_reference,
    "cli": cli_reference,
    "control-api": control_api_reference,
    "pool-api": pool_api_reference,
    "settings": settings_reference,
}


def on_startup(command: str, dirty: bool) -> None:
    """Before any plugin reads its configuration: mkdocstrings takes only search paths that exist."""
    lay_out_package()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    def made(match: re.Match[str]) -> str:
        maker = _MAKERS.get(match.group(1))
        if maker is None:
            raise ValueError(f"{page.file.src_path}: no reference called {match.group(1)!r} ({', '.join(_MAKERS)})")
        return maker()

    return _MARKER.sub(made, markdown)
