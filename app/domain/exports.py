"""CSV files a visitor downloads and opens in a spreadsheet: every text cell is data, never a
formula. A cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return is one a
spreadsheet may run (`=HYPERLINK(...)` in a model's answer or a visitor's question), so it gets
a leading `'`, as OWASP advises; numbers stay numbers."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: object) -> object:
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_text(columns: Sequence[str], rows: Iterable[Mapping[str, object]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({key: safe_cell(value) for key, value in row.items()} for row in rows)
    return out.getvalue()
