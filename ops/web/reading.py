"""What every page of the web view shares: the query string read as filters, a page's
content before it is laid out (:class:`Shown`), and the filter form (GET, so that a
filtered list is a URL to share)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from starlette.datastructures import QueryParams

from ...routing.contract.errors import KeylaneError
from .html import Child, Html, link, tag

#: The most rows a page may show (as the CLI's --limit).
MAX_LIMIT = 1000


@dataclass(frozen=True)
class Params:
    """A page's query string."""

    query: QueryParams

    def one(self, name: str) -> str:
        """The parameter ``name`` (stripped; empty when absent)."""
        return (self.query.get(name) or "").strip()

    def all(self, name: str) -> list[str]:
        """Every value of a repeated parameter, the empty ones left out."""
        return [v.strip() for v in self.query.getlist(name) if v.strip()]

    def limit(self, default: int) -> int:
        """``limit``: rows a page, 1 to :data:`MAX_LIMIT` (``default`` when absent)."""
        text = self.one("limit")
        if not text:
            return default
        if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
            raise KeylaneError(f"limit={text}: rows a page, 1 to {MAX_LIMIT}")
        return int(text)

    def any(self) -> bool:
        """Whether any filter is set (paging and page size aside)."""
        return any(self.one(k) for k in self.query if k not in ("limit", "before", "after"))


@dataclass
class Shown:
    """A page's title and content, read in a thread; laid out by ``html.page``."""

    title: str
    body: list[Child]
    status_code: int = 200
    notice: Child = None


def filter_form(action: str, *fields: Child) -> Html:
    """The filters of a list: a GET form, so the filtered list's URL can be shared."""
    return tag(
        "form",
        tag("div", fields, class_="fields"),
        tag("div", tag("button", "Filter", type="submit"), link(action, "Clear"), class_="go"),
        method="get",
        action=action,
        class_="filters",
    )


def select(name: str, label: str, options: Iterable[str], chosen: str, blank: bool = True) -> Html:
    """A labelled ``<select>``; its first option (when ``blank``) is any."""
    choices = [tag("option", "any", value="")] if blank else []
    choices += [tag("option", o, value=o, selected=o == chosen) for o in options]
    return tag("label", tag("span", label), tag("select", choices, name=name))


def text_input(name: str, label: str, value: str, placeholder: str) -> Html:
    """A labelled text field."""
    field_ = tag("input", type="text", name=name, value=value, placeholder=placeholder)
    return tag("label", tag("span", label), field_)
