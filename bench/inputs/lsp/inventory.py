"""Stock levels from a CSV of movements (date, sku, quantity, note), and the items to reorder.

python inventory.py movements.csv --reorder-below 10
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path


@dataclass
class Item:
    sku: str
    on_hand: int = 0
    received: int = 0
    shipped: int = 0
    last_movement: date | None = None
    notes: list[str] = field(default_factory=list)

    def apply(self, when: date, quantity: int, note: str) -> None:
        self.on_hand += quantity
        if quantity > 0:
            self.received += quantity
        else:
            self.shipped -= quantity
        if self.last_movement is None or when > self.last_movement:
            self.last_movement = when
        if note:
            self.notes.append(note)


class BadRow(ValueError):
    def __init__(self, line: int, reason: str):
        super().__init__(f"line {line}: {reason}")
        self.line = line


def read_movements(path: Path) -> list[tuple[date, str, int, str]]:
    rows = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"date", "sku", "quantity"} - set(reader.fieldnames or [])
        if missing:
            raise BadRow(1, f"missing columns: {', '.join(sorted(missing))}")
        for line, row in enumerate(reader, start=2):
            try:
                when = date.fromisoformat(row["date"].strip())
            except ValueError:
                raise BadRow(line, f"not a date: {row['date']!r}") from None
            try:
                quantity = int(row["quantity"])
            except ValueError:
                raise BadRow(line, f"not a whole number: {row['quantity']!r}") from None
            sku = row["sku"].strip().upper()
            if not sku:
                raise BadRow(line, "empty sku")
            rows.append((when, sku, quantity, (row.get("note") or "").strip()))
    return rows


def stock(movements: list[tuple[date, str, int, str]], until: date | None = None) -> dict[str, Item]:
    items: dict[str, Item] = {}
    for when, sku, quantity, note in sorted(movements):
        if until is not None and when > until:
            break
        items.setdefault(sku, Item(sku)).apply(when, quantity, note)
    return items


def to_reorder(items: dict[str, Item], threshold: int) -> list[Item]:
    low = [item for item in items.values() if item.on_hand < threshold]
    return sorted(low, key=lambda item: (item.on_hand, item.sku))


def monthly_shipped(movements: list[tuple[date, str, int, str]]) -> dict[str, dict[str, int]]:
    months: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for when, sku, quantity, _ in movements:
        if quantity < 0:
            months[when.strftime("%Y-%m")][sku] -= quantity
    return {month: dict(skus) for month, skus in sorted(months.items())}


def report(items: dict[str, Item], threshold: int) -> str:
    width = max((len(sku) for sku in items), default=3)
    lines = [f"{'sku':<{width}}  on hand  received  shipped  last movement"]
    for item in sorted(items.values(), key=lambda i: i.sku):
        flag = "  <- reorder" if item.on_hand < threshold else ""
        lines.append(
            f"{item.sku:<{width}}  {item.on_hand:>7}  {item.received:>8}  {item.shipped:>7}  {item.last_movement}{flag}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("--reorder-below", type=int, default=5)
    parser.add_argument("--until", type=date.fromisoformat, default=None, help="stock as of this date")
    args = parser.parse_args(argv)
    try:
        movements = read_movements(args.csv)
    except (OSError, BadRow) as e:
        print(f"inventory: {e}", file=sys.stderr)
        return 2
    items = stock(movements, args.until)
    print(report(items, args.reorder_below))
    low = to_reorder(items, args.reorder_below)
    if low:
        print(f"\n{len(low)} to reorder: {', '.join(item.sku for item in low)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
