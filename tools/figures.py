"""docs/FIGURES.md's tables from docs/figures.toml: today's figures, one record per figure.

    python -m tools.figures            # print the generated tables
    python -m tools.figures --write    # rewrite docs/FIGURES.md between its markers
    python -m tools.figures --check    # exit 1 (naming --write) when the page is stale
    python -m tools.figures add ...    # append records from a bench JSON or a study
                                       # (tools/figures_add.py), then --write

The house rule is applied by Figure.counts (tools/figures_data.py), not by hand: a figure counts
only for a config that passes the verifier, comes from an agent trial or a fresh-process bench
of a promoted config, and has its memory footprint beside it; the "counts" column says which of
the three a row lacks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine import doc_block
from engine.errors import ConfigError
from tools.figures_data import COMMAND, DATA, PAGE, Figure, load

__all__ = ["COMMAND", "DATA", "PAGE", "Figure", "load", "main", "render"]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(tables: list[dict], commands: dict[str, str], figures: list[Figure]) -> str:
    """One table per [[table]], its rows newest first, the commands its rows name below it."""
    out: list[str] = []
    for t in tables:
        rows = sorted(
            (f for f in figures if f.table == t["key"]), key=lambda f: f.date, reverse=True
        )
        if not rows:
            continue
        out += [f"## {t['title']}", "", _cell(t.get("note", "")), ""]
        used = list(dict.fromkeys(f.command for f in rows))
        if all(f.throughput for f in rows):
            out += [
                "| date | device | model | metric | figure | source |",
                "|---|---|---|---|---|---|",
            ]
            for f in rows:
                out.append(
                    f"| {f.date} | {_cell(f.device)} | {_cell(f.model)} | {_cell(f.metric)} | "
                    f"{_cell(f.figure)} | {f.source} [{used.index(f.command) + 1}] |"
                )
        else:
            out += [
                "| date | device | model | metric | figure | config | llama.cpp, same call | "
                "memory | validate | source | counts |",
                "|---|---|---|---|---:|---|---:|---|---|---|---|",
            ]
            for f in rows:
                out.append(
                    f"| {f.date} | {_cell(f.device)} | {_cell(f.model)} | {_cell(f.metric)} | "
                    f"{_cell(f.figure)} | {_cell(f.config)} | {_cell(f.reference) or '-'} | "
                    f"{_cell(f.memory) or 'not measured'} | {_cell(f.validate) or '-'} | "
                    f"{f.source} [{used.index(f.command) + 1}] | {f.counts()} |"
                )
        # A list item, not a cell: a | stays as written.
        out += [""] + [f"{n}. {' '.join(commands[c].split())}" for n, c in enumerate(used, 1)]
        out += [""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["add"]:
        return _add(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--page", type=Path, default=PAGE)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the page's generated section")
    mode.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = ap.parse_args(argv)
    try:
        text = render(*load(args.data))
        if args.write:
            changed = doc_block.write(args.page, COMMAND, text)
            print(f"{args.page}: {'rewritten' if changed else 'already current'}")
        elif args.check:
            try:
                page = doc_block.section(args.page.read_text(), COMMAND, str(args.page))
            except OSError as e:
                raise ConfigError(f"{args.page}: cannot read ({e.strerror or e})") from None
            if page != text:
                print(f"{args.page} is stale: run `{COMMAND}`", file=sys.stderr)
                return 1
        else:
            print(text, end="")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def _add(argv: list[str]) -> int:
    from tools.figures_add import add, parser

    args = parser(DATA).parse_args(argv)
    try:
        recs = add(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r in recs:
        print(f"added: {r['table']} {r['date']} {r['model']} {r['metric']} {r['figure']}")
    print(f"{args.data}: {len(recs)} records added; now run `{COMMAND}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
