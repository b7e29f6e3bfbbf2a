"""The metric schema as docs/observability.md shows it: one markdown table per group. ``python -m
relayrl.monitor.schema_doc`` prints them, and a test keeps the page equal to them."""

from __future__ import annotations

from relayrl.monitor.schema import GROUPS, SCHEMA


def schema_markdown() -> str:
    """The schema as one markdown table per group (what docs/observability.md shows)."""
    parts = []
    for group in GROUPS:
        rows = [
            f"| `{m.name}` | {m.unit} | {m.meaning.replace('|', chr(92) + '|')} | {m.when} |"
            for m in SCHEMA
            if m.group == group
        ]
        parts.append(
            "\n".join([f"### {group}/*", "", "| metric | unit | meaning | when |", "|---|---|---|---|", *rows])
        )
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":  # regenerate the tables of docs/observability.md
    print(schema_markdown(), end="")  # noqa: T201 - the tables go to stdout, to paste into the doc
