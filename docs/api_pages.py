"""MkDocs hook: the API reference, one page per module, generated from the nav's list.

The "API reference" section of mkdocs.yml's nav is the one list of documented modules: an entry
`api/<dotted.module>.md` that is not a file under docs/ becomes a page holding mkdocstrings'
`::: <dotted.module>`, and `api/index.md`'s `<!-- api-modules -->` marker becomes a list of them
under the nav's section names. Renaming a module is one line: its nav entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mkdocs.structure.files import File, Files

PREFIX = "api/"
INDEX = "api/index.md"
MARKER = "<!-- api-modules -->"


def api_entries(nav: Any, section: str = "") -> Iterator[tuple[str, str]]:
    """(section title, page path) of every module page in the nav, in order."""
    if isinstance(nav, str):
        if nav.startswith(PREFIX) and nav != INDEX:
            yield section, nav
    elif isinstance(nav, list):
        for item in nav:
            yield from api_entries(item, section)
    elif isinstance(nav, dict):
        for title, value in nav.items():
            if isinstance(value, str):
                yield from api_entries(value, section)
            else:
                yield from api_entries(value, title)


def module_of(path: str) -> str:
    """`api/jaxrl.trainers.ppo.md` -> `jaxrl.trainers.ppo`."""
    return path.removeprefix(PREFIX).removesuffix(".md")


def on_files(files: Files, config: Any) -> Files:
    """Add a generated page for each module of the nav that has no file of its own."""
    for _, path in api_entries(config["nav"]):
        if files.get_file_from_path(path) is None:
            module = module_of(path)
            content = f"# {module}\n\n::: {module}\n    options:\n      show_root_heading: false\n"
            files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """List the reference's modules, by nav section, where api/index.md has the marker."""
    if page.file.src_uri != INDEX or MARKER not in markdown:
        return markdown
    lines, current = [], None
    for section, path in api_entries(config["nav"]):
        if section != current:
            lines += ["", f"**{section}**", ""]
            current = section
        lines.append(f"- [`{module_of(path)}`]({path.removeprefix(PREFIX)})")
    return markdown.replace(MARKER, "\n".join(lines).strip())
