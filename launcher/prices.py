"""Hourly cost of a job from the dated price table `vm_prices.csv` (see its header for the source).

Prices differ by region, so the table has a row per (region, size) and a job is priced in its stack's
region; where the table has no figure for that region the line says so and names the region it used.
`python -m launcher.prices --refresh REGION` writes that region's rows from the public Azure Retail Prices
API (needs internet access to prices.azure.com; not reachable from this project's CI), keeping the others.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import pathlib
import re
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass

TABLE = pathlib.Path(__file__).with_name("vm_prices.csv")
FIELDS = ("region", "vm_size", "dedicated", "low_priority")
API = "https://prices.azure.com/api/retail/prices"

Prices = dict[tuple[str, str], tuple[float, float | None]]  # (region, vm_size) -> (dedicated, spot or None)


def table(path: pathlib.Path = TABLE) -> tuple[str, Prices]:
    lines = path.read_text().splitlines()
    header = "\n".join(line[2:] for line in lines if line.startswith("#"))
    rows = csv.DictReader(line for line in lines if not line.startswith("#"))
    prices = {
        (r["region"], r["vm_size"]): (float(r["dedicated"]), float(r["low_priority"]) if r["low_priority"] else None)
        for r in rows
    }
    return header, prices


@dataclass(frozen=True)
class Quote:
    """One node-hour of a size: the price, which row gave it and how old that row is."""

    vm_size: str  # as the table spells it
    per_node_hour: float
    kind: str  # "low priority" or "dedicated"
    region: str  # the table's region that gave the price
    wanted_region: str | None  # the job's or stack's region
    date: str | None  # YYYY-MM-DD the header gives for that region's rows, if any
    source: str  # the table header's first line
    no_low_priority_price: bool  # low priority asked, the table has none: priced as dedicated

    def line(self, nodes: int) -> str:
        """Where the number comes from, in one line (the dry run's and the ledger's)."""
        line = f"{nodes} x {self.vm_size} ({self.kind}) at ${self.per_node_hour:.3f}/node-hour in {self.region}; {self.source}"
        if self.region != self.wanted_region:
            # A price from another region can be off by tens of percent: say so on the same line.
            line += (
                f" -- NOT the stack's region ({self.wanted_region or 'unknown: the stack outputs have no location'}); "
                f"refresh with `python -m launcher.prices --refresh {self.wanted_region or 'REGION'}`"
            )
        return line


def quote(vm_size: str, low_priority: bool, region: str | None, path: pathlib.Path = TABLE) -> tuple[Quote | None, str]:
    """(the price of one node-hour, or None and a line naming what is missing and the fix). Size names are matched
    without regard to case, as Azure treats them (ARM answers some in capitals: STANDARD_ND96ASR_V4)."""
    header, prices = table(path)
    source = header.splitlines()[0] if header else path.name
    spelled = {size.lower(): size for _, size in prices}
    size = spelled.get(vm_size.lower())
    regions = sorted({r for r, s in prices if s == size})
    if not regions:
        return None, (
            f"no price for {vm_size} in launcher/vm_prices.csv (any region): add it with "
            f"`python -m launcher.prices --refresh {region or 'REGION'}` where prices.azure.com is reachable"
        )
    used = region if region in regions else regions[0]
    dedicated, spot = prices[(used, size)]
    low = low_priority and spot is not None
    return Quote(
        vm_size=size,
        per_node_hour=spot if low else dedicated,
        kind="low priority" if low else "dedicated",
        region=used,
        wanted_region=region,
        date=dated(header, used),
        source=source,
        no_low_priority_price=low_priority and spot is None,
    ), ""


def dated(header: str, region: str) -> str | None:
    """The date the table's header gives for `region`'s rows ("eastus: unverified figures of 2026-11-22",
    "westeurope: fetched ... on 2026-12-01")."""
    m = re.search(rf"\b{re.escape(region)}: [^\n]*?(\d{{4}}-\d{{2}}-\d{{2}})", header)
    return m.group(1) if m else None


def hourly(
    vm_size: str, nodes: int, low_priority: bool, region: str | None, path: pathlib.Path = TABLE
) -> tuple[float | None, str]:
    """(USD per hour for the job's nodes or None, a line saying where the number comes from)."""
    found, missing = quote(vm_size, low_priority, region, path)
    if found is None:
        return None, missing
    return nodes * found.per_node_hour, found.line(nodes)


def parse_api(items: list[dict]) -> tuple[float | None, float | None]:
    """(pay-as-you-go, spot/low-priority) Linux price per hour from Retail Prices API items of one size."""
    linux = [i for i in items if "Windows" not in i["productName"] and i.get("type", "Consumption") == "Consumption"]
    normal = [i["retailPrice"] for i in linux if "Spot" not in i["skuName"] and "Low Priority" not in i["skuName"]]
    spot = [i["retailPrice"] for i in linux if "Spot" in i["skuName"] or "Low Priority" in i["skuName"]]
    return (min(normal) if normal else None), (min(spot) if spot else None)


def _fetch(region: str, size: str) -> list[dict]:
    query = f"armRegionName eq '{region}' and armSkuName eq '{size}' and priceType eq 'Consumption'"
    url = f"{API}?$filter=" + urllib.parse.quote(query)
    items = []
    while url:  # the API pages its answers (NextPageLink)
        page = json.load(urllib.request.urlopen(url, timeout=30))
        items += page.get("Items", [])
        url = page.get("NextPageLink")
    return items


def refresh(region: str, path: pathlib.Path = TABLE, fetch=_fetch, today: dt.date | None = None) -> str:
    """The table with `region`'s rows fetched for every size the table knows; other regions kept. The header
    dates them (the cost ledger states the date of the price it used)."""
    header, prices = table(path)
    sizes = sorted({size for _, size in prices})
    fresh = {}
    for size in sizes:
        normal, spot = parse_api(fetch(region, size))
        if normal is not None:
            fresh[(region, size)] = (normal, spot)
    kept = {k: v for k, v in prices.items() if k[0] != region}
    out = io.StringIO()
    notes = [line for line in header.splitlines() if not line.startswith(f"{region}: fetched")]
    out.write("".join(f"# {line}\n" for line in notes))
    out.write(
        f"# {region}: fetched from the Azure Retail Prices API on {(today or dt.date.today()).isoformat()} by "
        f"`python -m launcher.prices --refresh {region}`.\n"
    )
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS)
    for (reg, size), (normal, spot) in sorted({**kept, **fresh}.items()):
        writer.writerow([reg, size, f"{normal:.3f}", "" if spot is None else f"{spot:.3f}"])
    return out.getvalue()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refresh", metavar="REGION", required=True, help="Azure region short name, e.g. westeurope")
    TABLE.write_text(refresh(ap.parse_args().refresh))
    print(f"wrote {TABLE}", file=sys.stderr)
