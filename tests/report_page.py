"""A small reader of report pages for the tests (the standard library's HTML parser, no extra package): the
document as a tree, and what the tests ask of it: headings, sections in order, a table's rows, texts by id."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {
    "meta",
    "link",
    "br",
    "img",
    "hr",
    "input",
    "col",
    "source",
    "wbr",
    "area",
    "base",
    "embed",
    "param",
    "track",
}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list = field(default_factory=list)  # Node or str
    parent: Node | None = None

    def text(self) -> str:
        parts = []
        for child in self.children:
            parts.append(child if isinstance(child, str) else child.text())
        return " ".join(" ".join(parts).split())

    def walk(self):
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.walk()

    def find_all(self, tag: str | None = None, **attrs: str) -> list[Node]:
        return [
            n
            for n in self.walk()
            if (tag is None or n.tag == tag) and all(n.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())
        ]

    def find(self, tag: str | None = None, **attrs: str) -> Node | None:
        found = self.find_all(tag, **attrs)
        return found[0] if found else None


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.current = self.root
        self.errors: list[str] = []

    def handle_starttag(self, tag, attrs):
        node = Node(tag, {k: v or "" for k, v in attrs}, parent=self.current)
        self.current.children.append(node)
        if tag not in VOID:
            self.current = node

    def handle_startendtag(self, tag, attrs):
        self.current.children.append(Node(tag, {k: v or "" for k, v in attrs}, parent=self.current))

    def handle_endtag(self, tag):
        node = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        if node is None:
            self.errors.append(f"stray </{tag}>")
            return
        if node is not self.current:
            self.errors.append(f"<{self.current.tag}> closed by </{tag}>")
        self.current = node.parent or self.root

    def handle_data(self, data):
        if data.strip():
            self.current.children.append(data)


def parse(text: str) -> Node:
    builder = _Builder()
    builder.feed(text)
    builder.close()
    assert builder.errors == [], builder.errors[:5]
    return builder.root


def by_id(root: Node, ident: str) -> Node:
    found = root.find(id=ident)
    assert found is not None, f"no element with id {ident}"
    return found


def headings(root: Node) -> list[tuple[int, str]]:
    return [(int(n.tag[1]), n.text()) for n in root.walk() if n.tag in ("h1", "h2", "h3", "h4", "h5", "h6")]


def section_ids(root: Node) -> list[str]:
    """The top-level sections of <main>, in page order."""
    main = root.find("main")
    return [n.attrs["id"] for n in main.children if isinstance(n, Node) and n.tag == "section"]


def table_rows(root: Node, table_id: str) -> list[dict[str, str]]:
    """Each body row as {data-field: text} (cells without a field are left out)."""
    table = by_id(root, table_id)
    body = table.find("tbody")
    return [
        {cell.attrs["data-field"]: cell.text() for cell in row.find_all("td") if "data-field" in cell.attrs}
        for row in body.find_all("tr")
    ]


def table_headers(root: Node, table_id: str) -> list[str]:
    return [th.text() for th in by_id(root, table_id).find("thead").find_all("th")]
